"""Where a variant's `find_links` wheels come from: the URL the matrix names (the PyTorch CPU
index's torch page), or, only when a machine says so, a local mirror folder that stands in for
it. Either way the lock names the URL and its hashes pin the bytes. Pages are `file://` URLs
in a temporary folder: nothing here reaches a network."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import threading
from pathlib import Path

import pytest

from builder.core import settings, simple_index
from builder.core.errors import BuilderError
from builder.model import matrix
from builder.stages import locks
from builder.stages.wheelhouse import Wheelhouse

ROOT = Path(__file__).resolve().parents[3]
URL = "https://download.pytorch.org/whl/cpu/torch/"
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
OTHER_PY = "torch-2.13.0+cpu-cp313-cp313-manylinux_2_28_x86_64.whl"
OLDER = "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def cpu_variant(find_links: tuple[str, ...]) -> matrix.Variant:
    shipped = matrix.load(ROOT / "matrix.yaml").variant("2.13.0-py3.11-cpu-runtime")
    return dataclasses.replace(shipped, find_links=find_links)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def page(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """A PEP 503 page as the PyTorch index serves it (`+` quoted, `#sha256=` fragments)."""
    served = tmp_path / "served"
    served.mkdir()
    files = {name: f"wheel bytes of {name}".encode() for name in (TORCH, OTHER_PY, OLDER)}
    anchors = []
    for name, data in files.items():
        (served / name).write_bytes(data)
        anchors.append(f'<a href="{name.replace("+", "%2B")}#sha256={sha(data)}">{name}</a><br/>')
    (served / "index.html").write_text("<html><body>" + "".join(anchors) + "</body></html>")
    return (served / "index.html").as_uri(), files


def lock_text(files: dict[str, bytes], *names: str) -> str:
    hashes = "".join(f" \\\n    --hash=sha256:{sha(files[n])}" for n in names)
    return f"torch==2.13.0+cpu{hashes}\nnumpy==2.4.6 \\\n    --hash=sha256:{'1' * 64}\n"


def test_a_mirror_stands_in_for_urls_only_when_a_machine_sets_one() -> None:
    local = settings.Settings.from_env({})
    assert local.wheel_sources([URL, "/srv/wheels"]) == (URL, "/srv/wheels")
    mirrored = settings.Settings.from_env({settings.WHEEL_MIRROR_ENV: "/m1:/m2"})
    assert mirrored.wheel_sources([URL, "/m1"]) == ("/m1", "/m2")


def test_pips_own_find_links_folders_are_the_mirror_unless_one_is_named(tmp_path: Path) -> None:
    env = {settings.PIP_FIND_LINKS_ENV: f"{tmp_path} https://elsewhere.example/ /no/such/dir"}
    assert settings.Settings.from_env(env).wheel_mirror == (str(tmp_path),)
    env[settings.WHEEL_MIRROR_ENV] = "/chosen"
    assert settings.Settings.from_env(env).wheel_mirror == ("/chosen",)


def test_a_lock_made_from_the_mirror_names_the_declared_url() -> None:
    made_here = ("--index-url https://pypi.org/simple\n--find-links /opt/wheels\n\n"
                 "torch==2.13.0+cpu \\\n    --hash=sha256:" + "a" * 64 + "\n")
    assert locks.declared_find_links(made_here, [URL]).splitlines()[:3] == [
        "--index-url https://pypi.org/simple", f"--find-links {URL}", ""]


def test_the_page_lists_each_file_with_its_hash(page) -> None:
    url, files = page
    listed = {f.filename: f for f in simple_index.project_files(url)}
    assert set(listed) == set(files)
    assert listed[TORCH].sha256 == sha(files[TORCH])
    assert listed[TORCH].url.endswith("torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")


def test_without_a_mirror_the_host_fetches_only_the_locked_wheel_of_its_python(
        page, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(settings.WHEEL_MIRROR_ENV, raising=False)
    monkeypatch.delenv(settings.PIP_FIND_LINKS_ENV, raising=False)
    url, files = page
    house = Wheelhouse(tmp_path / "house")
    text = lock_text(files, TORCH, OTHER_PY)
    [got] = house.source_wheels(cpu_variant((url,)), (url,), text)
    assert got.name == TORCH and got.read_bytes() == files[TORCH]
    assert house.source_wheels(cpu_variant((url,)), (url,), text) == [got]  # kept, by hash


def test_bytes_the_lock_does_not_name_are_refused_and_not_kept(page, tmp_path: Path) -> None:
    url, _ = page
    listed = {f.filename: f for f in simple_index.project_files(url)}
    lying = dataclasses.replace(listed[TORCH], sha256=None)  # a page without hashes
    with pytest.raises(BuilderError, match="which the lock does not name: refused"):
        simple_index.download(lying, tmp_path, {"0" * 64})
    assert not [p for p in tmp_path.iterdir() if p.name != "served"]


def test_with_a_mirror_the_url_is_never_asked(tmp_path: Path, monkeypatch) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / TORCH).write_bytes(b"torch")
    monkeypatch.setenv(settings.WHEEL_MIRROR_ENV, str(mirror))
    never = "http://127.0.0.1:9/torch/"  # nothing answers on the discard port
    house = Wheelhouse(tmp_path / "house")
    text = lock_text({TORCH: b"torch"}, TORCH)
    assert house.source_wheels(cpu_variant((never,)), (never,), text) == [mirror / TORCH]


def test_an_unreachable_page_names_its_url_and_the_mirror_setting(tmp_path: Path) -> None:
    with pytest.raises(BuilderError, match="cannot read the wheel page file://") as caught:
        simple_index.project_files((tmp_path / "none.html").as_uri())
    assert settings.WHEEL_MIRROR_ENV in (caught.value.hint or "")


def test_a_pin_from_a_page_gets_every_hash_of_its_version_that_the_page_lists(page) -> None:
    url, files = page
    made_by_uv = (f"--index-url https://pypi.org/simple\n--find-links {url}\n\n"
                  "numpy==2.4.6 \\\n    --hash=sha256:" + "1" * 64 + "\ntorch==2.13.0+cpu\n")
    text = locks.with_page_hashes(made_by_uv, [url])
    block = text.split("torch==2.13.0+cpu", 1)[1]
    assert {h.split()[0] for h in block.split("--hash=sha256:")[1:]} == {
        sha(files[TORCH]), sha(files[OTHER_PY])}
    assert sha(files[OLDER]) not in text  # another version
    with pytest.raises(BuilderError, match=r"no page of .* lists its sha256"):
        locks.with_page_hashes(made_by_uv.replace("torch==2.13.0+cpu", "torch==9.9"), [url])


def test_a_fetched_wheel_is_readable_by_the_builds_user(page, tmp_path: Path) -> None:
    url, files = page
    [listed] = [f for f in simple_index.project_files(url) if f.filename == TORCH]
    simple_index.download(listed, tmp_path, {sha(files[TORCH])})
    assert (tmp_path / TORCH).stat().st_mode & 0o777 == 0o644


def test_a_page_naming_a_path_instead_of_a_file_is_refused(tmp_path: Path) -> None:
    planted = simple_index.IndexFile("../../etc/evil.whl", (tmp_path / "x").as_uri(), None)
    with pytest.raises(BuilderError, match="not a plain file name: refused"):
        simple_index.download(planted, tmp_path, {"0" * 64})


def test_a_find_links_page_is_fetched_once_per_run_by_every_variant(page, monkeypatch) -> None:
    """`lock --check` resolves variants on threads; the CPU torch page (megabytes) is read once."""
    url, files = page
    fetched: list[str] = []
    real = simple_index.project_files
    monkeypatch.setattr(simple_index, "project_files", lambda u: fetched.append(u) or real(u))
    made_by_uv = f"--find-links {url}\n\ntorch==2.13.0+cpu\n"
    texts: list[str] = []
    threads = [threading.Thread(target=lambda: texts.append(locks.with_page_hashes(made_by_uv,
                                                                                   [url])))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fetched == [url] and len(texts) == 6 and len(set(texts)) == 1
    assert sha(files[TORCH]) in texts[0]


def test_uv_resolves_for_the_variants_python_without_downloading_one(monkeypatch) -> None:
    """The target python is a marker environment: uv must not fetch a managed interpreter (a
    minute per resolve, under one machine-wide lock, on a machine that cannot reach it)."""
    seen: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> None:
        seen.append(argv)
        Path(argv[argv.index("-o") + 1]).write_text("numpy==2.4.6\n")

    monkeypatch.setattr(locks.proc, "run", run)
    monkeypatch.setattr(locks.proc, "host_ca_bundle", lambda: None)
    locks.resolve(cpu_variant(()), ["numpy"])
    assert "--no-python-downloads" in seen[0] and "--python-version" in seen[0]
    assert seen[0][seen[0].index("--python") + 1] == sys.executable
