"""`builder lock --check`: a lock compared with a re-resolution of its own inputs (the resolver
faked here: it answers what the index would, the genuine lock), one `file:LINE` per
difference."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from builder.flows import lock_check
from builder.model import lockfile, matrix

ROOT = Path(__file__).resolve().parents[3]
CPU = "2.13.0-py3.11-cpu-runtime"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[matrix.Variant, Path, str]:
    variant = next(v for v in matrix.load(ROOT / "matrix.yaml").variants if v.id == CPU)
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    return variant, tmp_path / "locks", (ROOT / "locks" / f"{CPU}.txt").read_text()


def index_answering(genuine: str, seen: list[str]) -> lock_check.Resolver:
    def resolve(variant: matrix.Variant, reqs: list[str], preferred: str) -> str:
        seen.append(preferred)
        return genuine
    return resolve


def test_the_shipped_lock_matches_and_no_hash_reaches_the_resolver(setup) -> None:
    variant, folder, genuine = setup
    seen: list[str] = []
    assert lock_check.check_variant(variant, folder, index_answering(genuine, seen)) == []
    assert "--hash" not in seen[0] and "numpy==" in seen[0]  # versions preferred, hashes asked
    assert "--find-links https://download.pytorch.org/whl/cpu/torch/" in seen[0]


def test_a_swapped_hash_and_a_planted_package_are_named_by_line(setup) -> None:
    variant, folder, genuine = setup
    lines = genuine.splitlines(keepends=True)
    first = next(i for i, x in enumerate(lines) if x.startswith("filelock=="))
    a, b = lines[first + 1], lines[first + 2]  # filelock's two hashes, swapped for others'
    other = next(x for x in lines[first + 3:] if "--hash=" in x)
    lines[first + 1] = other.rstrip("\n").rstrip(" \\") + " \\\n"
    evil = ["evilpkg==1.0 \\\n", "    --hash=sha256:" + "e" * 64 + "\n"]
    lines[first + 3:first + 3] = evil
    path = folder / f"{CPU}.txt"
    path.write_text("".join(lines))
    problems = lock_check.check_variant(variant, folder, index_answering(genuine, []))
    digest = other.split("--hash=")[1].split()[0]
    assert problems == [
        f"{path}:{first + 2}: filelock==4.3.2 --hash={digest} is not a hash the index serves "
        "for it",
        f"{path}:{first + 1}: filelock==4.3.2 lacks 1 hash(es) the index serves (first: "
        f"--hash={a.split('--hash=')[1].split()[0]})",
        f"{path}:{first + 4}: evilpkg==1.0 is not part of the resolution (not required by "
        "anything the lock's inputs ask for)"]
    assert b  # filelock's second hash stays


def test_a_changed_version_and_a_dropped_package_are_named(setup) -> None:
    variant, folder, genuine = setup
    path = folder / f"{CPU}.txt"
    text = genuine.replace("numpy==2.4.6", "numpy==2.4.5")
    start = text.index("mpmath==")
    end = text.index("\n", text.index("--hash", start) + 1)  # mpmath has one hash
    path.write_text(text[:start] + text[end + 1:])
    problems = lock_check.check_variant(variant, folder, index_answering(genuine, []))
    assert any(p.endswith("numpy==2.4.5, the index resolves numpy==2.4.6") for p in problems)
    assert any("mpmath==1.3.0 is required but missing" in p for p in problems)
    assert all(p.startswith(f"{path}:") for p in problems)


def test_check_all_reports_every_variant(setup) -> None:
    variant, folder, genuine = setup
    said: list[str] = []
    assert lock_check.check_all([variant], folder, index_answering(genuine, []),
                                progress=said.append) == []
    assert said == [f"  matches   {variant.key}"]
    assert lockfile.lock_paths(folder, variant)[0].exists()


def test_check_all_resolves_at_once_and_reports_in_matrix_order(setup) -> None:
    """The variants wait on the index together (a barrier only all of them can pass), and the
    last to finish is still reported in its matrix place."""
    _, folder, _ = setup
    shipped = matrix.load(ROOT / "matrix.yaml").variants
    chosen = [v for v in shipped if v.flavor != "devel"][:4]
    together = threading.Barrier(len(chosen), timeout=10)

    def resolve(v: matrix.Variant, reqs: list[str], preferred: str) -> str:
        together.wait()  # BrokenBarrierError unless every variant is being resolved at once
        time.sleep(0.05 if v is chosen[0] else 0)  # the first finishes last
        return lockfile.lock_paths(folder, v)[0].read_text()  # what the index answers

    said: list[str] = []
    assert lock_check.check_all(chosen, folder, resolve, progress=said.append) == []
    assert said == [f"  matches   {v.key}" for v in chosen]
