"""SBOM stage: collectors, CycloneDX document, diff, audit. Docker tests build tiny images."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from packageurl import PackageURL

import sbom
from sbom import dpkg
from sbom.audit import audit, audit_debian
from sbom.collect import read_tar_stream
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
