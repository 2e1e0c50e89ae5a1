"""SBOM stage without an engine: validation, IRI checks, purls, dpkg order, diff, audit merge,
the tar reader and the overlay2 walk, a whole document from synthetic facts."""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import os
import random
import stat
import tarfile
from pathlib import Path

import pytest
from packageurl import PackageURL

import sbom
from sbom import dpkg, iri, layers, pydist
from sbom.audit import audit_debian
from sbom.bom import build_document, deb_purl, pypi_purl
from sbom.collect import (
    ImageContents,
    ImageFacts,
    NativeLib,
    PythonDist,
    read_layers,
    read_tar_stream,
    record_digests,
)
from sbom.diff import diff_sboms, format_diff
from sbom.validate import SbomInvalid, write

# Each pair sorts a < b in dpkg's order (tests/e2e checks them against the dpkg binary).
ORDERED_VERSIONS = [("1.0", "1.0-1"), ("1.0~rc1", "1.0"), ("2.0", "1:0.9"),
                    ("2.36-9+deb12u4", "2.36-9+deb12u10"), ("1.0a", "1.0+b1"),
                    ("1.0~~", "1.0~"), ("0:1.2", "1.2.0"), ("1.2-3", "1.2-3.1")]


def tiny_doc(components: list[dict]) -> dict:
    """A minimal valid CycloneDX 1.6 document around `components` (e2e tests use it too)."""
    return {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
            "metadata": {"component": {"type": "container", "name": "x", "version": "1",
                                       "bom-ref": "image:x"}},
            "components": components}


def test_invalid_document_raises_and_writes_nothing(tmp_path):
    bad = tiny_doc([{"type": "not-a-type", "name": "x"}])
    target = tmp_path / "bom.json"
    with pytest.raises(SbomInvalid):
        write(bad, target)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_diff_sboms_on_dicts():
    old = tiny_doc([{"type": "library", "name": "a", "version": "1", "purl": "pkg:pypi/a@1"},
                     {"type": "library", "name": "b", "version": "1", "purl": "pkg:pypi/b@1"}])
    new = tiny_doc([{"type": "library", "name": "a", "version": "2", "purl": "pkg:pypi/a@2"},
                     {"type": "library", "name": "c", "version": "1", "purl": "pkg:pypi/c@1"}])
    result = diff_sboms(old, new)
    assert result["changed"] == [{"type": "pypi", "namespace": "", "name": "a",
                                  "old": "1", "new": "2", "direction": "upgrade"}]
    assert [r["name"] for r in result["removed"]] == ["b"]
    assert [r["name"] for r in result["added"]] == ["c"]
    assert "~ pypi/a 1 → 2" in format_diff(result)




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

    doc = tiny_doc([{"type": "library", "name": "libc6", "version": "2.36-9",
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


@pytest.mark.parametrize("a,b", ORDERED_VERSIONS)
def test_compare_versions_orders_like_dpkg(a, b):
    assert dpkg.compare_versions(a, b) < 0 < dpkg.compare_versions(b, a)
    assert dpkg.compare_versions(a, a) == 0


def test_purls_are_normalized_like_syft():
    assert pydist.normalize("Foo_Bar.Baz") == "foo-bar-baz"
    assert pypi_purl("Foo_Bar.Baz", "1.0").to_string() == "pkg:pypi/foo-bar-baz@1.0"
    assert pypi_purl("torch", "2.5.1+cpu").to_string() == "pkg:pypi/torch@2.5.1%2Bcpu"
    (pkg,) = dpkg.parse_status(["Package: libc6\nStatus: install ok installed\n"
                                "Version: 2.36-9+deb12u4\nArchitecture: amd64\nSource: glibc\n"])
    purl = deb_purl(pkg, "debian", "debian-12")
    assert (purl.namespace, purl.name, purl.version) == ("debian", "libc6", "2.36-9+deb12u4")
    assert purl.qualifiers == {"arch": "amd64", "distro": "debian-12", "upstream": "glibc"}
    (bin_nmu,) = dpkg.parse_status(["Package: x\nVersion: 1-1+b1\nArchitecture: all\n"
                                    "Source: x (1-1)\n"])
    assert deb_purl(bin_nmu, "debian", "debian-12").qualifiers["upstream"] == "x@1-1"


_IRI_CASES = {
    "https://a.b/c?d=e#f": True, "mailto:x@y": True, "urn:uuid:1": True, "pkg:pypi/a@1": True,
    "http://é.example/ü": True, "http://[::1]/": True, "http://[v1.x]/": True, "/a/b": True,
    "": True, "?q": True, "//u@h:80/p": True, "http://x?\ue000": True,
    "http://h:x/": False, "http://%zz": False, "x y": False, "http://x/<y>": False,
    "1http://x": False, ":a": False, "http://x#\ue000": False, "http://[1:2]/": False,
    "http://x/\U0001f600": True, "http://x?\U000f0000": True, "http://x/\U000f0000": False,
    "http://x/\U000e0001": False, "http://x/\x01": False, "http://x/\ufffe": False,
}


@pytest.mark.parametrize("value,valid", _IRI_CASES.items())
def test_iri_reference_regex(value, valid):
    assert iri.is_iri_reference(value) is valid
    assert iri.is_iri_reference(123)


def test_iri_regex_agrees_with_rfc3987_syntax():
    """The parser jsonschema would use, on random strings from the grammar's interesting
    characters. Left out where rfc3987-syntax departs from the RFC: IP literals (it rejects `::`
    elision) and characters beyond the Basic Multilingual Plane (it rejects them all)."""
    syntax = pytest.importorskip("rfc3987_syntax")
    alphabet = list("ab:/?#@%9.-_~!$&'()*+,;=AF1 \u00e9\ue000\u00a0<>{}|^`\"\\")
    rng = random.Random(3987)
    cases = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9))) for _ in range(400)]
    comparable = [v for v in _IRI_CASES if "[" not in v and max(v, default="a") < "\U00010000"]
    for value in [*cases, *comparable]:
        assert iri.is_iri(value) == syntax.is_valid_syntax("iri", value), value
        assert iri.is_iri_reference(value) == syntax.is_valid_syntax("iri_reference", value), value


def test_validation_checks_iri_formats():
    ok = tiny_doc([{"type": "library", "name": "a", "externalReferences": [
        {"type": "website", "url": "https://example.org/a b"}]}])
    with pytest.raises(SbomInvalid, match="not valid"):
        sbom.validate(ok)
    ok["components"][0]["externalReferences"][0]["url"] = "https://example.org/a%20b"
    sbom.validate(ok)


_STATUS = """Package: libc6
Status: install ok installed
Version: 2.36-9+deb12u4
Architecture: amd64
Source: glibc
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Description: GNU C Library: Shared libraries

Package: zlib1g
Status: install ok installed
Version: 1:1.2.13.dfsg-1
Architecture: amd64
Depends: libc6 (>= 2.14)
"""
_SITE = "/opt/venv/lib/python3.11/site-packages"


def _facts() -> ImageFacts:
    lib = b"\x7fELF cudnn"
    contents = ImageContents(
        os_release={"ID": "debian", "VERSION_ID": "12"},
        dpkg_status=[_STATUS],
        copyrights={"zlib1g": "License: Zlib\n"},
        dists=[PythonDist(_SITE, "nvidia_cudnn_cu12-9.1.0.70.dist-info", "3.11",
                          metadata="Name: nvidia-cudnn-cu12\nVersion: 9.1.0.70\n"
                                   "License-Expression: LicenseRef-NVIDIA-Proprietary\n"
                                   "Home-page: https://developer.nvidia.com/cudnn\n",
                          record="nvidia/cudnn/lib/libcudnn.so.9,sha256=x,12\n")],
        native_libs=[NativeLib(f"{_SITE}/nvidia/cudnn/lib/libcudnn.so.9", _SITE,
                               "nvidia/cudnn/lib/libcudnn.so.9",
                               hashlib.sha256(lib).hexdigest(), len(lib))],
        collector="overlay2",
    )
    return ImageFacts(ref="example/img:1", image_id="sha256:" + "1" * 64, repo_tags=[],
                      repo_digests=["example/img@sha256:" + "2" * 64],
                      labels={"org.opencontainers.image.created": "2024-05-01T12:00:00Z"},
                      created="2024-05-01T12:00:00Z", os="linux", architecture="amd64",
                      contents=contents)


def test_document_from_synthetic_facts_is_valid(tmp_path):
    doc = build_document(_facts(), reproducible=True)
    path = write(doc, tmp_path / "bom.json")  # validates
    assert path.read_text().endswith("}\n")
    purls = {c["purl"] for c in doc["components"] if "purl" in c}
    assert "pkg:pypi/nvidia-cudnn-cu12@9.1.0.70" in purls
    assert any(p.startswith("pkg:deb/debian/zlib1g@1:1.2.13.dfsg-1?") for p in purls)
    deps = {d["ref"]: d.get("dependsOn", []) for d in doc["dependencies"]}
    zlib = next(r for r in deps if r.startswith("pkg:deb/debian/zlib1g@"))
    assert deps[zlib] == [next(r for r in deps if r.startswith("pkg:deb/debian/libc6@"))]
    wheel = next(c for c in doc["components"] if c["name"] == "nvidia-cudnn-cu12")
    (lib,) = wheel["components"]
    assert PackageURL.from_string(lib["purl"]).qualifiers["checksum"].startswith("sha256:")
    assert doc["metadata"]["timestamp"].startswith("2024-05-01T12:00:00")


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_record_digests_lists_libraries_with_a_valid_sha256_and_size():
    good = _record_hash(b"lib")
    record = (f'torch/lib/libc10.so,sha256={good},3\n"torch/lib/lib,comma.so",sha256={good},3\n'
              f"torch/__init__.py,sha256={good},3\ntorch/lib/libnosize.so,sha256={good},\n"
              "torch/lib/libbad.so,sha256=x,3\ntorch/lib/libmd5.so,md5=abc,3\n"
              "torch-1.dist-info/RECORD,,\n")
    assert list(record_digests(record)) == [
        ("torch/lib/libc10.so", hashlib.sha256(b"lib").hexdigest(), 3),
        ("torch/lib/lib,comma.so", hashlib.sha256(b"lib").hexdigest(), 3),
    ]


def test_library_digest_from_record_only_when_size_and_layer_agree(tmp_path):
    sp = "usr/local/lib/python3.11/site-packages"
    claimed = b"the bytes the wheel held"  # RECORD's digest: proves the file was not read
    n = len(claimed)
    record = "".join(f"torch/lib/{name},sha256={_record_hash(claimed)},{n}\n"
                     for name in ("libsame.so", "libresized.so", "libreplaced.so"))
    lower = _mklayer(tmp_path / "0", {
        f"{sp}/torch-1.dist-info/METADATA": b"Name: torch\nVersion: 1\n",
        f"{sp}/torch-1.dist-info/RECORD": record.encode(),
        f"{sp}/torch/lib/libsame.so": b"s" * n,
        f"{sp}/torch/lib/libresized.so": b"short",
        f"{sp}/torch/lib/libreplaced.so": b"r" * n,
        f"{sp}/torch/lib/libunlisted.so": b"u",
    })
    upper = _mklayer(tmp_path / "1", {f"{sp}/torch/lib/libreplaced.so": b"R" * n})
    got = {lib.rel: (lib.sha256, lib.digest_from)
           for lib in read_layers([upper, lower]).native_libs}
    assert got == {
        "torch/lib/libsame.so": (hashlib.sha256(claimed).hexdigest(), "wheel-record"),
        "torch/lib/libresized.so": (hashlib.sha256(b"short").hexdigest(), "file"),
        "torch/lib/libreplaced.so": (hashlib.sha256(b"R" * n).hexdigest(), "file"),
        "torch/lib/libunlisted.so": (hashlib.sha256(b"u").hexdigest(), "file"),
    }


def test_jsonschema_keeps_its_format_checks_after_our_import():
    """Whether or not sbom.validate imported jsonschema first (see test_sbom's fresh-process
    test), IRIs and durations are still checked for every schema in the process."""
    importlib.import_module("sbom.validate")._validator()
    import jsonschema

    for checker in (jsonschema.Draft202012Validator.FORMAT_CHECKER, jsonschema.FormatChecker()):
        assert checker.conforms("P1D", "duration") and not checker.conforms("P1", "duration")
        assert checker.conforms("http://x/é", "iri") and not checker.conforms("x y", "iri")
        assert not checker.conforms("a b", "iri-reference")


def test_python_packages_are_unknown_when_pypi_cannot_be_asked(monkeypatch):
    """PyPI's per-release data unreachable: every Python package is an `unknown` row, never a
    clean one (what publish's default audit attaches on a machine without PyPI's JSON)."""
    import importlib

    audit_mod = importlib.import_module("sbom.audit")
    monkeypatch.setattr(audit_mod, "_run_pip_audit", lambda *a: (
        audit_mod._source("unreachable", "ConnectionError", 0), None))
    pkgs = [(PackageURL.from_string("pkg:pypi/numpy@2.3.5"), "r1"),
            (PackageURL.from_string("pkg:pypi/torch@2.13.0%2Bcpu"), "r2")]
    _, out = audit_mod.audit_python(pkgs)
    assert out["status"]["status"] == "unreachable"
    assert sorted(u["name"] for u in out["unknown"]) == ["numpy", "torch"]
    assert [u["reason"] for u in out["unknown"] if u["name"] == "numpy"] == [
        "PyPI's advisory data: unreachable"]
