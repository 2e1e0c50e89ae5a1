"""SBOM stage: collectors, CycloneDX document, diff, audit. Docker tests build tiny images."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from packageurl import PackageURL

import sbom
from sbom import dpkg, layers
from sbom.audit import audit, audit_debian
from sbom.collect import read_export, read_layers, read_tar_stream
from sbom.diff import diff_sboms, format_diff
from sbom.validate import SbomInvalid, write

BASE = "local/debian:bookworm-minbase"
SITE = "/opt/venv/lib/python3.11/site-packages"
CUDNN_BYTES = b"\x7fELF fake cudnn " * 64
CREATED = "2024-05-01T12:00:00Z"


# ---- helpers -----------------------------------------------------------------------------------


def _docker_ready() -> bool:
    try:
        from builder import engine

        engine.ensure_engine()
        return engine.inspect_image(BASE) is not None
    except Exception:
        return False


docker_needed = pytest.mark.skipif(not _docker_ready(), reason=f"no Docker engine or no {BASE}")


def _dist(name: str, version: str, requires: list[str] = (), files: dict[str, bytes] = ()) -> str:
    """Shell lines creating a fake dist-info (and files listed in its RECORD)."""
    files = dict(files)
    dist_info = f"{SITE}/{re.sub(r'[-.]', '_', name)}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            "License: MIT", "Summary: fake"] + [f"Requires-Dist: {r}" for r in requires]
    record = [f"{path},sha256=x,{len(data)}" for path, data in files.items()]
    lines = [f"mkdir -p {dist_info}",
             f"printf '%s\\n' {' '.join(repr(m) for m in meta)} > {dist_info}/METADATA",
             f"printf '%s\\n' {' '.join(repr(r) for r in record) or repr('')} > {dist_info}/RECORD"]
    return " && ".join(lines)


def _build(tmp: Path, tag: str, body: str, labels: dict[str, str], secret: Path | None = None):
    from builder import engine

    (tmp / "Dockerfile").write_text(body)
    args = ["build", "-q", "-t", tag]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    if secret is not None:
        args += ["--secret", f"id=ca,src={secret}"]
    engine.docker(*args, str(tmp), timeout=300)


def _image_dockerfile(*, variant: str) -> str:
    cudnn = "\\177ELF fake cudnn " * 64  # dash printf: octal escapes only
    dists = [
        _dist("nvidia-cudnn-cu12", "9.1.0.70", ["nvidia-cublas-cu12"],
              {"nvidia/cudnn/lib/libcudnn.so.9": CUDNN_BYTES}),
        _dist("nvidia-cublas-cu12", "12.4.5.8" if variant == "a" else "12.6.4.1"),
        _dist("Foo_Bar.Baz", "1.0", ["nvidia-cudnn-cu12", 'old-thing; python_version < "3"',
                                     'extra-thing; extra == "x"']),
        _dist("torch", "2.5.1+cpu", ["nvidia-cudnn-cu12"]),  # no RECORD line: owner guessed
    ]
    if variant == "a":
        dists.append(_dist("removed-later", "0.1"))
    else:
        dists.append(_dist("added-later", "3.0"))
    return (
        f"FROM {BASE}\n"
        "RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt "
        "cat /etc/ssl/certs/ca-certificates.crt > /dev/null || true\n"
        f"RUN mkdir -p {SITE}/nvidia/cudnn/lib {SITE}/torch/lib && "
        f"printf '{cudnn}' > {SITE}/nvidia/cudnn/lib/libcudnn.so.9 && "
        f"printf 'torchlib' > {SITE}/torch/lib/libtorch_cpu.so && "
        + " && ".join(dists) + "\n"
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory):
    """Two synthetic images (a, b) differing in a few Python packages; removed afterwards."""
    if not _docker_ready():
        pytest.skip(f"no Docker engine or no {BASE}")
    from builder import engine

    tmp = tmp_path_factory.mktemp("sbom-images")
    secret = tmp / "fake-ca.crt"
    marker = f"SECRET-MARKER-{uuid.uuid4().hex}"
    secret.write_text(f"-----BEGIN CERTIFICATE-----\n{marker}\n-----END CERTIFICATE-----\n")
    suffix = uuid.uuid4().hex[:8]
    tags = {v: f"sbomtest/synthetic-{v}:{suffix}" for v in "ab"}
    labels = {
        "org.opencontainers.image.created": CREATED,
        "org.opencontainers.image.base.name": BASE,
        "org.opencontainers.image.base.digest": "sha256:" + "ab" * 32,
        "io.torch-images.torch": "2.5.1",
    }
    try:
        for variant, tag in tags.items():
            ctx = tmp / variant
            ctx.mkdir()
            _build(ctx, tag, _image_dockerfile(variant=variant), labels, secret=secret)
        yield {"tags": tags, "marker": marker, "tmp": tmp}
    finally:
        for tag in tags.values():
            engine.remove_image(tag)


@pytest.fixture(scope="module")
def doc_a(images) -> dict:
    return sbom.generate(images["tags"]["a"])


def _all(doc: dict) -> list[dict]:
    from sbom.diff import iter_components

    return list(iter_components(doc))


def _by_name(doc: dict, name: str) -> dict:
    return next(c for c in _all(doc) if c["name"] == name)


# ---- Docker: generate ------------------------------------------------------------------------


@pytest.mark.docker
def test_deb_purls_have_arch_and_distro(doc_a):
    debs = [c for c in _all(doc_a) if c.get("purl", "").startswith("pkg:deb/")]
    assert len(debs) > 50
    for comp in debs:
        purl = PackageURL.from_string(comp["purl"])
        assert purl.namespace == "debian"
        assert purl.qualifiers["arch"] in ("amd64", "all", "arm64")
        assert purl.qualifiers["distro"] == "debian-12"
        assert comp["bom-ref"] == comp["purl"]
    libc = _by_name(doc_a, "libc6")
    assert PackageURL.from_string(libc["purl"]).qualifiers["upstream"].startswith("glibc")


@pytest.mark.docker
def test_pypi_purls_are_normalized(doc_a):
    comp = _by_name(doc_a, "foo-bar-baz")
    assert comp["purl"] == "pkg:pypi/foo-bar-baz@1.0"
    assert comp["licenses"][0]["license"]["id"] == "MIT"
    assert comp["evidence"]["occurrences"][0]["location"] == f"{SITE}/Foo_Bar_Baz-1.0.dist-info"


@pytest.mark.docker
def test_nvidia_libs_nested_under_their_wheel(doc_a):
    wheel = _by_name(doc_a, "nvidia-cudnn-cu12")
    (lib,) = wheel["components"]
    purl = PackageURL.from_string(lib["purl"])
    assert (purl.type, purl.namespace, purl.name, purl.version) == (
        "generic", "nvidia", "libcudnn", "9.1.0.70")
    assert lib["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(CUDNN_BYTES).hexdigest()}]
    location = f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9"
    assert lib["evidence"]["occurrences"] == [{"location": location}]
    torch_lib = _by_name(doc_a, "torch")["components"][0]
    assert torch_lib["purl"].startswith("pkg:generic/torch/libtorch_cpu@2.5.1%2Bcpu")


@pytest.mark.docker
def test_document_valid_with_metadata_and_dependencies(doc_a, images):
    sbom.validate(doc_a)
    meta = doc_a["metadata"]
    assert meta["component"]["type"] == "container"
    assert meta["component"]["version"] == images["tags"]["a"].rsplit(":", 1)[1]
    props = {p["name"]: p["value"] for p in meta["component"]["properties"]}
    assert props["io.torch-images.torch"] == "2.5.1"
    tools = {t["name"] for t in meta["tools"]["components"]}
    assert {"torch-images", "cyclonedx-python-lib"} <= tools
    base = next(c for c in doc_a["components"] if c["type"] == "container")
    assert base["name"] == "local/debian" and base["version"] == "sha256:" + "ab" * 32
    deps = {d["ref"]: d.get("dependsOn", []) for d in doc_a["dependencies"]}
    assert deps["pkg:pypi/foo-bar-baz@1.0"] == ["pkg:pypi/nvidia-cudnn-cu12@9.1.0.70"]
    assert "pkg:pypi/nvidia-cublas-cu12@12.4.5.8" in deps["pkg:pypi/nvidia-cudnn-cu12@9.1.0.70"]
    assert any(r.startswith("pkg:deb/debian/libc6@") for r in deps[
        next(r for r in deps if r.startswith("pkg:deb/debian/coreutils@"))])


@pytest.mark.docker
def test_reproducible_is_byte_identical(images, tmp_path):
    tag = images["tags"]["a"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    write(sbom.generate(tag, reproducible=True), one)
    write(sbom.generate(tag, reproducible=True), two)
    assert one.read_bytes() == two.read_bytes()
    doc = json.loads(one.read_text())
    assert doc["metadata"]["timestamp"].startswith("2024-05-01T12:00:00")
    assert doc["serialNumber"].startswith("urn:uuid:")


@pytest.mark.docker
def test_xml_output(doc_a, tmp_path):
    path = write(doc_a, tmp_path / "bom.xml", "xml")
    text = path.read_text()
    assert text.startswith("<?xml") and "pkg:pypi/foo-bar-baz@1.0" in text


@pytest.mark.docker
def test_diff_between_images(images, doc_a):
    doc_b = sbom.generate(images["tags"]["b"])
    result = diff_sboms(doc_a, doc_b)
    assert [a["name"] for a in result["added"]] == ["added-later"]
    assert [r["name"] for r in result["removed"]] == ["removed-later"]
    changed = {c["name"]: (c["old"], c["new"]) for c in result["changed"]}
    assert changed == {"nvidia-cublas-cu12": ("12.4.5.8", "12.6.4.1")}


@pytest.mark.docker
def test_no_secret_or_host_path_in_sbom(images, tmp_path):
    doc = sbom.generate(images["tags"]["a"])
    path = write(doc, tmp_path / "bom.json")
    text = path.read_text()
    assert images["marker"] not in text
    assert str(images["tmp"]) not in text and str(tmp_path) not in text
    assert os.path.expanduser("~") + "/" not in text
    assert "BEGIN CERTIFICATE" not in text


@pytest.mark.docker
def test_cli_sbom_and_diff(images, tmp_path, capsys):
    import argparse

    from builder import cli
    from builder import sbom as cmd

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cmd.register(sub, cli.common_parser())
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    for variant, out in (("a", out_a), ("b", out_b)):
        args = parser.parse_args(["sbom", images["tags"][variant], "-o", str(out)])
        assert args.func(args) == 0
    args = parser.parse_args(["sbom", "diff", str(out_a), str(out_b), "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["added"][0]["name"] == "added-later"


# ---- no Docker ----------------------------------------------------------------------------------


def _tiny_doc(components: list[dict]) -> dict:
    return {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
            "metadata": {"component": {"type": "container", "name": "x", "version": "1",
                                       "bom-ref": "image:x"}},
            "components": components}


def test_invalid_document_raises_and_writes_nothing(tmp_path):
    bad = _tiny_doc([{"type": "not-a-type", "name": "x"}])
    target = tmp_path / "bom.json"
    with pytest.raises(SbomInvalid):
        write(bad, target)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_diff_sboms_on_dicts():
    old = _tiny_doc([{"type": "library", "name": "a", "version": "1", "purl": "pkg:pypi/a@1"},
                     {"type": "library", "name": "b", "version": "1", "purl": "pkg:pypi/b@1"}])
    new = _tiny_doc([{"type": "library", "name": "a", "version": "2", "purl": "pkg:pypi/a@2"},
                     {"type": "library", "name": "c", "version": "1", "purl": "pkg:pypi/c@1"}])
    result = diff_sboms(old, new)
    assert result["changed"] == [{"type": "pypi", "namespace": "", "name": "a",
                                  "old": "1", "new": "2"}]
    assert [r["name"] for r in result["removed"]] == ["b"]
    assert [r["name"] for r in result["added"]] == ["c"]
    assert "~ pypi/a 1 → 2" in format_diff(result)


def test_audit_reports_unreachable_debian_source():
    doc = _tiny_doc([{"type": "library", "name": "libc6", "version": "2.36-9",
                      "purl": "pkg:deb/debian/libc6@2.36-9?arch=amd64&distro=debian-12"}])
    report = audit(doc, debian_mirror="http://127.0.0.1:9/debian-security", timeout=5)
    status = report["sources"]["debian-security"]
    assert status["status"] == "unreachable"
    assert report["ok"] is False
    assert [u["name"] for u in report["unknown"]] == ["libc6"]


def test_audit_reports_unreachable_pypi(monkeypatch):
    if not shutil.which("pip-audit"):
        pytest.skip("pip-audit not installed")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    doc = _tiny_doc([
        {"type": "library", "name": "requests", "version": "2.19.0",
         "purl": "pkg:pypi/requests@2.19.0"},
        {"type": "library", "name": "torch", "version": "2.5.1+cpu",
         "purl": "pkg:pypi/torch@2.5.1%2Bcpu"},
    ])
    report = audit(doc, debian_mirror="http://127.0.0.1:9/x", timeout=60)
    assert report["sources"]["pypi"]["status"] in ("unreachable", "error")
    assert not report["vulnerabilities"] and report["ok"] is False
    reasons = {u["name"]: u["reason"] for u in report["unknown"]}
    assert "local version" in reasons["torch"]


def test_debian_audit_compares_with_dpkg_order(monkeypatch):
    import importlib

    audit_mod = importlib.import_module("sbom.audit")  # `sbom.audit` is the function

    monkeypatch.setattr(audit_mod, "security_versions",
                        lambda *a, **k: {"libc6": "2.36-9+deb12u10", "zlib1g": "1:1.2.13"})
    pkgs = [(PackageURL.from_string("pkg:deb/debian/libc6@2.36-9+deb12u4?arch=amd64"), "r1"),
            (PackageURL.from_string("pkg:deb/debian/zlib1g@1:1.2.13?arch=amd64"), "r2")]
    _, out = audit_debian(pkgs, suite="bookworm-security", mirror="unused")
    assert [v["name"] for v in out["vulnerabilities"]] == ["libc6"]
    assert out["vulnerabilities"][0]["fix_versions"] == ["2.36-9+deb12u10"]
    assert out["status"]["status"] == "ok"


def test_add_to_sbom_is_valid():
    from sbom.audit import add_to_sbom

    doc = _tiny_doc([{"type": "library", "name": "libc6", "version": "2.36-9",
                      "bom-ref": "pkg:deb/debian/libc6@2.36-9",
                      "purl": "pkg:deb/debian/libc6@2.36-9"}])
    report = {"sources": {"debian-security": {"status": "ok", "detail": "", "checked": 1}},
              "unknown": [], "ok": False,
              "vulnerabilities": [{"id": "bookworm-security:libc6@2.36-9+deb12u1",
                                   "source": "debian-security",
                                   "ref": "pkg:deb/debian/libc6@2.36-9",
                                   "name": "libc6", "version": "2.36-9",
                                   "fix_versions": ["2.36-9+deb12u1"], "aliases": [],
                                   "description": "update"}]}
    sbom.validate(add_to_sbom(doc, report))


@pytest.mark.parametrize("a,b", [("1.0", "1.0-1"), ("1.0~rc1", "1.0"), ("1:0.9", "2.0"),
                                 ("2.36-9+deb12u4", "2.36-9+deb12u10"), ("1.0a", "1.0+b1")])
def test_compare_versions_matches_dpkg(a, b):
    expected = None
    if shutil.which("dpkg"):
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode
        expected = lt == 0
    assert (dpkg.compare_versions(a, b) < 0) == (expected if expected is not None else True)
    assert dpkg.compare_versions(a, a) == 0


def test_tar_reader_reads_needed_members_and_hashes_libs():
    buf = io.BytesIO()
    long_dir = "opt/venv/lib/python3.11/site-packages/nvidia/" + "x" * 120 + "/lib"
    members = {
        "etc/os-release": b'ID=debian\nVERSION_ID="12"\n',
        "var/lib/dpkg/status": b"Package: a\nStatus: install ok installed\nVersion: 1\n",
        f"{long_dir}/libfoo.so.1": b"lib-bytes",
        "opt/venv/lib/python3.11/site-packages/a-1.dist-info/METADATA": b"Name: a\nVersion: 1\n",
        "usr/bin/big": b"\0" * 100_000,
    }
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    contents = read_tar_stream(buf)
    assert contents.os_release == {"ID": "debian", "VERSION_ID": "12"}
    assert len(contents.dpkg_status) == 1
    (lib,) = contents.native_libs
    assert lib.path == "/" + f"{long_dir}/libfoo.so.1"
    assert lib.sha256 == hashlib.sha256(b"lib-bytes").hexdigest()
    assert contents.dists[0].metadata.startswith("Name: a")


# ---- overlay2 fast path ---------------------------------------------------------------------


def _contents_key(contents) -> dict:
    """Everything collected, less how it was read (bytes_read, collector differ by design)."""
    import dataclasses

    data = dataclasses.asdict(contents)
    data.pop("bytes_read"), data.pop("collector")
    return data


_LAYERED = f"""FROM {BASE}
RUN mkdir -p {SITE}/torch/lib {SITE}/nvidia/cublas/lib {SITE}/nvidia/opq \\
 && printf 'old-torch' > {SITE}/torch/lib/libtorch_cpu.so \\
 && printf 'hard' > {SITE}/torch/lib/libc10.so && ln {SITE}/torch/lib/libc10.so {SITE}/torch/lib/libc10_hl.so \\
 && printf 'cublas' > {SITE}/nvidia/cublas/lib/libcublas.so.12 \\
 && printf 'deleted' > {SITE}/nvidia/cublas/lib/libcublasLt.so.12 \\
 && {_dist("deleted-dist", "1.0")} && {_dist("kept-dist", "1.0")} \\
 && mkdir -p {SITE}/nvidia/opq/lib && printf 'lower' > {SITE}/nvidia/opq/lib/libold.so \\
 && mkdir -p {SITE}/replaced && printf 'file' > {SITE}/replaced/x \\
 && rm -f /usr/share/doc/libc6/copyright
RUN printf 'new-torch' > {SITE}/torch/lib/libtorch_cpu.so \\
 && rm {SITE}/nvidia/cublas/lib/libcublasLt.so.12 \\
 && rm -rf {SITE}/deleted_dist-1.0.dist-info \\
 && rm -rf {SITE}/nvidia/opq && mkdir -p {SITE}/nvidia/opq/lib \\
 && printf 'upper' > {SITE}/nvidia/opq/lib/libnew.so \\
 && {_dist("added-dist", "2.0")} \\
 && printf 'new-copyright' > /usr/share/doc/libc6/copyright
"""


@pytest.fixture(scope="module")
def layered_image(tmp_path_factory: pytest.TempPathFactory):
    """An image whose second layer overwrites, deletes and replaces what the first made."""
    if not _docker_ready():
        pytest.skip(f"no Docker engine or no {BASE}")
    from builder import engine

    tag = f"sbomtest/layered:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path_factory.mktemp("sbom-layered")
    try:
        _build(ctx, tag, _LAYERED, {})
        yield engine.inspect_image(tag)
    finally:
        engine.remove_image(tag)


@pytest.mark.docker
def test_overlay2_layers_give_the_same_contents_as_export(layered_image):
    from builder import engine

    try:
        dirs = layers.layer_dirs(layered_image, engine.engine_address())
    except layers.Unavailable as exc:
        pytest.skip(f"overlay2 fast path not available here: {exc}")
    fast = read_layers(dirs)
    slow = read_export(layered_image["Id"])
    assert (fast.collector, slow.collector) == ("overlay2", "docker-export")
    assert _contents_key(fast) == _contents_key(slow)
    libs = {lib.rel: lib.sha256 for lib in fast.native_libs}
    assert libs == {
        "torch/lib/libtorch_cpu.so": hashlib.sha256(b"new-torch").hexdigest(),  # overwritten
        "torch/lib/libc10.so": hashlib.sha256(b"hard").hexdigest(),  # its hard link: a tar link
        "nvidia/cublas/lib/libcublas.so.12": hashlib.sha256(b"cublas").hexdigest(),
        "nvidia/opq/lib/libnew.so": hashlib.sha256(b"upper").hexdigest(),  # opaque dir
    }
    assert "nvidia/cublas/lib/libcublasLt.so.12" not in libs  # deleted (whiteout)
    dists = {d.dist_info for d in fast.dists}
    assert {"kept_dist-1.0.dist-info", "added_dist-2.0.dist-info"} <= dists
    assert "deleted_dist-1.0.dist-info" not in dists
    assert fast.copyrights["libc6"] == "new-copyright"
    assert fast.os_release["ID"] == "debian"


@pytest.mark.docker
def test_collect_says_which_path_it_used(layered_image, monkeypatch):
    from builder import engine
    from sbom.collect import read_contents

    try:
        layers.layer_dirs(layered_image, engine.engine_address())
        expected = "overlay2"
    except layers.Unavailable:
        expected = "docker-export"
    assert read_contents(layered_image).collector == expected
    monkeypatch.setenv("SBOM_COLLECTOR", "export")
    assert read_contents(layered_image).collector == "docker-export"
    monkeypatch.delenv("SBOM_COLLECTOR")
    # Not overlay2 (or a remote engine): the export stream, same contents.
    other = {**layered_image, "GraphDriver": {"Name": "vfs", "Data": {}}}
    assert read_contents(other).collector == "docker-export"


def test_layer_dirs_refuses_what_it_cannot_vouch_for(tmp_path):
    info = {"GraphDriver": {"Name": "overlay2", "Data": {"UpperDir": str(tmp_path / "x/diff")}}}
    with pytest.raises(layers.Unavailable, match="not local"):
        layers.layer_dirs(info, "tcp://10.0.0.1:2376")
    with pytest.raises(layers.Unavailable, match="not overlay2"):
        layers.layer_dirs({"GraphDriver": {"Name": "btrfs"}}, "unix:///var/run/docker.sock")
    if os.geteuid() == 0:
        with pytest.raises(layers.Unavailable, match="not readable"):
            layers.layer_dirs(info, "unix:///var/run/docker.sock")


def _mklayer(root: Path, files: dict[str, bytes | str | None], opaque: tuple[str, ...] = ()):
    """A layer diff dir: bytes a file, str a symlink, None a whiteout (0:0 char device)."""
    root.mkdir(parents=True)
    for name, value in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if value is None:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
        elif isinstance(value, str):
            path.symlink_to(value)
        else:
            path.write_bytes(value)
    for name in opaque:
        (root / name).mkdir(parents=True, exist_ok=True)
        os.setxattr(root / name, "trusted.overlay.opaque", b"y")
    return bytes(root)


def test_layer_walk_honours_whiteouts_opaque_dirs_and_order(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("whiteouts and trusted.* xattrs need root")
    sp = "usr/lib/python3/dist-packages"
    bottom = _mklayer(tmp_path / "0", {
        "etc/os-release": "../usr/lib/os-release",
        "usr/lib/os-release": b"ID=debian\n",
        "var/lib/dpkg/status": b"Package: a\n",
        "var/lib/dpkg/status.d/b": b"Package: b\n",
        f"{sp}/a-1.dist-info/METADATA": b"Name: a\n",
        f"{sp}/torch/lib/libgone.so": b"gone",
        f"{sp}/torch/lib/libkept.so": b"kept",
        f"{sp}/nvidia/x/lib/libold.so.1": b"old",
        f"{sp}/nvidia/file_then_dir": b"file",
        f"{sp}/nvidia/dir_then_file/lib/liby.so": b"y",
    })
    middle = _mklayer(tmp_path / "1", {
        f"{sp}/torch/lib/libgone.so": None,
        f"{sp}/torch/lib/libkept.so": b"kept-v2",
        f"{sp}/nvidia/x/lib/libnew.so.1": b"new",
        f"{sp}/nvidia/dir_then_file": b"now a file",
        f"{sp}/.wh.a-1.dist-info": b"",
    }, opaque=(f"{sp}/nvidia/x",))
    top = _mklayer(tmp_path / "2", {
        f"{sp}/nvidia/file_then_dir/lib/libz.so": b"z",
        "var/lib/dpkg/status.d/c": b"Package: c\n",
    })
    try:
        os.getxattr(middle + f"/{sp}/nvidia/x".encode(), "trusted.overlay.opaque")
    except OSError:
        pytest.skip("this filesystem keeps no trusted.* xattrs")
    names = [m.name for m in layers.walk([top, middle, bottom])]
    assert names == sorted(names, key=lambda n: n.split("/"))  # tar (WalkDir) order
    contents = read_layers([top, middle, bottom])
    assert contents.collector == "overlay2"
    assert contents.os_release == {"ID": "debian"}
    assert contents.dpkg_status == ["Package: a\n", "Package: b\n", "Package: c\n"]
    assert contents.dists == []  # whited out, AUFS style
    libs = {lib.rel: lib.sha256 for lib in contents.native_libs}
    assert libs == {
        "torch/lib/libkept.so": hashlib.sha256(b"kept-v2").hexdigest(),
        "nvidia/x/lib/libnew.so.1": hashlib.sha256(b"new").hexdigest(),
        "nvidia/file_then_dir/lib/libz.so": hashlib.sha256(b"z").hexdigest(),
    }
