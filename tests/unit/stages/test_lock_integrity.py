"""Locks are inputs with integrity: the `.json` records the sha256 of the `.txt`, every line is
of the lock grammar (checked against the recorded inputs), and facts that become tags are
versions. A hand edit is refused by validate, render and build with file:line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from builder.cli import main
from builder.core.errors import ConfigError
from builder.model import lockfile, matrix

ROOT = Path(__file__).resolve().parents[3]
CPU = "2.13.0-py3.11-cpu-runtime"


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    return tmp_path / "locks"


def variant() -> matrix.Variant:
    return matrix.load(ROOT / "matrix.yaml").variant(CPU)


def edit(folder: Path, change, *, rehash: bool = False) -> Path:
    """Change the CPU lock's text; with `rehash` also record its new sha256 (an attacker who
    edits both files)."""
    txt = folder / f"{CPU}.txt"
    txt.write_text(change(txt.read_text()))
    if rehash:
        js = folder / f"{CPU}.json"
        meta = json.loads(js.read_text())
        meta["text_sha256"] = lockfile.text_sha256(txt.read_text())
        js.write_text(json.dumps(meta))
    return txt


def test_every_shipped_lock_records_its_text_hash() -> None:
    m = matrix.load(ROOT / "matrix.yaml")
    for v in m.variants:
        assert lockfile.read_lock(ROOT / "locks", v) is not None, v.key


@pytest.mark.parametrize("change", [
    lambda t: t.replace("--index-url https://pypi.org/simple",
                        "--index-url https://pypi.org/simple\n--extra-index-url https://evil.example/simple"),
    lambda t: t + "evil==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n",
    lambda t: t.replace("02a8801bc6b2a80921bf3d7895c63084d53bae2a3c86783adce5ae2b89a1825b",
                        "0" * 64),
])
def test_a_hand_edited_lock_is_refused_by_its_recorded_hash(copied: Path, change) -> None:
    txt = edit(copied, change)
    with pytest.raises(ConfigError, match=rf"{txt}: its sha256 \w+ is not the \w+ recorded"):
        lockfile.read_lock(copied, variant())


@pytest.mark.parametrize(("change", "line", "why"), [
    (lambda t: t.replace("--find-links https://download.pytorch.org/whl/cpu/torch/",
                         "--find-links https://download.pytorch.org/whl/cpu/torch/\n--extra-index-url https://evil.example/simple"),
     3, "option `--extra-index-url https://evil.example/simple` is not one"),
    (lambda t: t.replace("filelock==4.3.2 \\", "filelock>=4 \\"), 4, "is not `name==version"),
    (lambda t: t.replace("filelock==4.3.2 \\", "filelock==4.3.2"), 4, "is not `name==version"),
    (lambda t: t + "evil==1.0\n", 0, "is not `name==version"),
    (lambda t: t.replace("--hash=sha256:02a8801b", "--hash=md5:02a8801b"), 5, "expected `    --hash"),
])
def test_every_line_must_be_of_the_lock_grammar(copied: Path, change, line: int, why: str) -> None:
    txt = edit(copied, change, rehash=True)
    where = str(line) if line else r"\d+"
    with pytest.raises(ConfigError, match=rf"{txt}:{where}: .*{re.escape(why)}"):
        lockfile.read_lock(copied, variant())


def test_facts_that_become_tags_must_be_versions(copied: Path) -> None:
    js = copied / f"{CPU}.json"
    meta = json.loads(js.read_text())
    meta["facts"]["torch"] = "2.13.0/../x y"
    js.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"facts.torch '2.13.0/../x y' is not a version"):
        lockfile.read_lock(copied, variant())


def test_render_names_the_edited_line(copied: Path, tmp_path: Path, capsys) -> None:
    txt = edit(copied, lambda t: t.replace("--find-links https://download.pytorch.org/whl/cpu/torch/",
                                          "--find-links https://download.pytorch.org/whl/cpu/torch/\n--extra-index-url https://evil.example/simple"),
               rehash=True)
    assert main(["render", "--matrix", str(ROOT / "matrix.yaml"), "--locks", str(copied),
                 "--select", f"id={CPU}", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"error: {txt}:3: option `--extra-index-url" in err
    assert "Traceback" not in err
