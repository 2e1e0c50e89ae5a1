"""The catalog's pure parts: tag classes, layer groups, evidence summaries, history and
changelog, the charts and the index rows (the registry side is tests/e2e/test_catalog_e2e.py)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bench.catalog_images import CREATED_BY, Spec, sbom_document, smoke_report
from builder.core import oci
from builder.core.errors import BuilderError
from builder.model import catalog_doc, layer_reuse
from builder.model import catalog_page as howto
from builder.stages import catalog, catalog_site

D1, D2, D3, D4, D5, D6 = (f"sha256:{c * 64}" for c in "123456")


def test_tags_are_told_apart_by_their_shape() -> None:
    tags = catalog_doc.classify(["2.9.1-py3.11-cpu-runtime", "2.9.1-py3.11-cpu-runtime-20261204",
                             "build-0123456789abcdef0123", f"sha256-{'a' * 64}.sbom",
                             f"sha256-{'b' * 64}.sig", "latest"])
    assert tags.images == ["2.9.1-py3.11-cpu-runtime", "2.9.1-py3.11-cpu-runtime-20261204",
                           "latest"]
    assert tags.builds == ["build-0123456789abcdef0123"]
    assert set(tags.artifacts) == {(f"sha256:{'a' * 64}", "sbom"), (f"sha256:{'b' * 64}", "sig")}
    assert catalog_doc.dated_key("x-cpu-slim-20261204.2") == ("x-cpu-slim", "20261204", 2)
    assert catalog_doc.dated_key("x-cpu-slim") is None


@pytest.mark.parametrize("text", ["torch", "127.0.0.1:5000", "r/x:tag", "r/x@sha256:ab"])
def test_a_source_is_registry_slash_repository(text: str) -> None:
    with pytest.raises(BuilderError, match="REGISTRY/REPOSITORY"):
        catalog.Source.parse(text)


def test_layers_are_grouped_by_the_template_step_that_made_them() -> None:
    spec = Spec(torch="2.15.0", python="3.11", flavor="runtime", cuda="13.2")
    history = [CREATED_BY[g] for g in spec.groups]
    assert catalog_doc.layer_groups(history, len(history)) == spec.groups
    # The smoke suite's COPY and the facts file after the install steps count as packages.
    assert catalog_doc.layer_groups([*history[:5], "COPY smoke /opt/torch-images/smoke"], 6)[-1] \
        == "packages"
    assert catalog_doc.layer_groups(["x"], 2) == ["base", "base"]  # history of another length


def test_a_cpu_slim_image_has_no_nvidia_or_toolchain_group() -> None:
    spec = Spec(torch="2.13.0+cpu", python="3.11", flavor="slim")
    assert catalog_doc.layer_groups([CREATED_BY[g] for g in spec.groups], 4) == [
        "base", "python", "torch", "packages"]


def test_evidence_summaries_keep_what_a_page_shows() -> None:
    spec = Spec(torch="2.13.0+cpu", python="3.11", flavor="runtime")
    sbom = catalog.summarise("sbom", json.dumps(sbom_document(spec, D1)).encode(), D1)
    assert sbom["counts"] == {"deb": 4, "pypi": 3} and sbom["vulnerabilities"] is None
    assert sbom["total"] == 7 and sbom["shells"] == ["bash 5.2.15-2+b7", "dash 0.5.12-2"]
    smoke = catalog.summarise("smoke", json.dumps(smoke_report(spec, "linux/amd64", D2))
                              .encode(), D1)
    assert smoke["status"] == "pass" and smoke["host"]["gpus"] == []
    assert howto.smoke_verdict({"present": True, **smoke}, "cpu") == {
        "state": "not-applicable", "css": "pass",
        "line": "pass on CPU; GPU checks not applicable (CPU image)",
        "short": "pass (CPU image)"}
    gpu = {"present": True, "status": "pass", "host": {"gpus": [{"name": "NVIDIA H100"}] * 2,
                                                     "driver": "580.95.05"},
           "checks": [{"name": "cuda", "status": "pass"}]}
    assert howto.smoke_verdict(gpu, "cuda")["line"] == \
        "pass on GPU: 2× NVIDIA H100, driver 580.95.05"
    assert catalog.summarise("audit", b"[]", D1) == {"error": "not a JSON object"}
    assert "unexpected content" in catalog.summarise("smoke", b'{"checks": [1]}', D1)["error"]


def image(digest: str, packages: dict[str, str], *, flavor: str = "runtime",
          vulns: int | None = None, reasons: list[str] | None = None) -> dict[str, Any]:
    comps = [{"type": "library", "name": n, "version": v, "purl": f"pkg:pypi/{n}@{v}"}
             for n, v in packages.items()]
    evidence = {"sbom": {"present": True, "components": comps, "counts": {"pypi": len(comps)},
                         "total": len(comps), "shells": [],
                         "spec_version": "1.6", "href": "evidence/x.sbom.json",
                         "vulnerabilities": None},
                "audit": {"present": True, "vulnerabilities": vulns, "sources": {}}
                if vulns is not None else {"present": False},
                "rebuild": {"present": True, "reasons": reasons} if reasons
                else {"present": False}}
    return {"digest": digest, "torch": "2.13.0", "python": "3.11", "accelerator": "cpu",
            "cuda": None, "flavor": flavor, "min_driver": None, "cuda_archs": [],
            "platforms": [{"platform": "linux/amd64", "size": 100, "evidence": evidence,
                           "audit": catalog_doc.audit_state(evidence),
                           "layers": [{"digest": D3, "size": 60, "group": "base"},
                                      {"digest": digest, "size": 40, "group": "packages"}]}]}


def test_history_is_oldest_first_with_the_sbom_diff_and_the_rebuild_reason() -> None:
    images = {D1: image(D1, {"numpy": "2.3.5", "six": "1.16.0"}, vulns=2),
              D2: image(D2, {"numpy": "2.3.6", "filelock": "3.20.1"}, vulns=0,
                        reasons=["python-vuln"])}
    by_tag = {"t": D2, "t-20261204": D2, "t-20261201": D1, "alias": D2}
    [variant] = [v for v in catalog_doc.variants(by_tag, images) if v["tag"] == "t"]
    assert variant["aliases"] == ["alias"]
    first, second = variant["history"]
    assert (first["tag"], first["changes"], first["vulnerabilities"]) == ("t-20261201", None, 2)
    assert second["reasons"] == ["python-vuln"] and second["vulnerabilities"] == 0
    changes = second["changes"]
    assert [c["name"] for c in changes["changed"]] == ["numpy"]
    assert [c["name"] for c in changes["added"]] == ["filelock"]
    assert [c["name"] for c in changes["removed"]] == ["six"]


def test_a_floating_tag_without_dated_tags_is_listed_with_an_empty_history() -> None:
    images = {D1: {**image(D1, {}), "variant": "t"}}
    [variant] = catalog_doc.variants({"t": D1}, images)
    assert variant == {"tag": "t", "digest": D1, "floating": True, "aliases": [],
                       "history": []}
    assert images[D1]["published"] is None


def test_a_hand_pushed_undated_tag_is_an_other_tag_and_the_site_is_still_written(
        tmp_path: Path) -> None:
    images = paged({D1: image(D1, {"numpy": "2.3.5"}), D2: image(D2, {"numpy": "2.3.6"})})
    by_tag = {"t": D1, "t-20261201": D1, "latest": D1, "scratch-<b>test": D2}
    doc = document(images, by_tag)
    doc["other_tags"] = catalog_doc.other_tags(by_tag, doc["variants"])
    assert [v["tag"] for v in doc["variants"]] == ["t"]
    assert doc["variants"][0]["aliases"] == ["latest"]
    assert doc["other_tags"] == [{"tag": "scratch-<b>test", "digest": D2}]
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    assert catalog_site.write_site(doc, tmp_path) > 0
    index = (tmp_path / "index.html").read_text()
    assert "Other tags" in index and "<code>scratch-&lt;b&gt;test</code>" in index


def document(images: dict[str, Any], by_tag: dict[str, str]) -> dict[str, Any]:
    return {"schema_version": 1, "generated_at": "2026-12-04T00:00:00Z",
            "registry": "r:5000", "repository": "torch", "tags": by_tag, "images": images,
            "variants": catalog_doc.variants(by_tag, images)}


def test_siblings_share_their_common_layers() -> None:
    runtime = {**image(D1, {}), "variant": "a-runtime"}
    slim = {**image(D2, {}, flavor="slim"), "variant": "a-slim"}
    doc = document({D1: runtime, D2: slim}, {"a-runtime": D1, "a-slim": D2})
    assert [tag for tag, _ in catalog_site.siblings(doc, runtime)] == ["a-slim", "a-runtime"]
    assert catalog_site.shared_bytes(runtime, slim) == 60  # the base layer D3


def test_charts_are_self_contained_svg_with_css_classes() -> None:
    chart = str(catalog_site.layer_chart([("slim", {"base": 10, "torch": 30}),
                                          ("runtime", {"base": 10, "toolchain": 5})]))
    assert chart.startswith("<svg") and 'class="g-torch"' in chart and "http" not in \
        chart.replace('xmlns="http://www.w3.org/2000/svg"', "")
    history = str(catalog_site.history_chart([
        {"tag": "<t>", "date": "2026-12-01", "size": 10, "vulnerabilities": None},
        {"tag": "t2", "date": "2026-12-04", "size": 20, "vulnerabilities": 3}]))
    assert "not audited" in history and "3 vuln." in history and "&lt;t&gt;" in history


def paged(images: dict[str, Any]) -> dict[str, Any]:
    """`images` with the facts a page prints besides those `image` makes."""
    for found in images.values():
        found.update(index=False, signature={"present": False, "signatures": 0, "attestations": [], "verified": None, "detail": None}, cudnn=None, nccl=None,
                     triton=None, created=None)
        found["platforms"][0].update(digest=found["digest"], labels={}, uncompressed_size=None)
        found["platforms"][0]["evidence"].update(
            smoke={"present": False}, provenance={"present": False})
    return images


def test_the_site_is_written_and_a_second_write_changes_nothing(tmp_path: Path) -> None:
    images = paged({D1: image(D1, {"numpy": "2.3.5"}), D2: image(D2, {"numpy": "2.3.6"})})
    doc = document(images, {"t": D2, "t-20261201": D1, "t-20261204": D2})
    schema = json.loads(catalog_doc.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert catalog_site.write_site(doc, tmp_path) > 0
    assert catalog_site.write_site(doc, tmp_path) == 0
    page = (tmp_path / "tags" / "t-20261204.html").read_text()
    assert "pypi/numpy 2.3.5 → 2.3.6" in page and "Dated tag (never moves)" in page
    index = (tmp_path / "index.html").read_text()
    assert 'data-tag="t"' in index and "index-by-torch.html" in index
    assert (tmp_path / "index-by-torch.html").is_file()


def test_the_cuda_architectures_come_from_the_smoke_report() -> None:
    env = {"name": "env", "metrics": {"actual": {"cuda_arch_flags": ["sm_80", "sm_90"]}}}
    cuda = {"name": "cuda", "metrics": {"arch_list": ["sm_90"]}}
    assert catalog_doc.arch_list([env, cuda]) == ["sm_80", "sm_90"]  # the wheel's own list first
    assert catalog_doc.arch_list([cuda]) == ["sm_90"]  # an older suite, on a GPU
    assert catalog_doc.arch_list([{"name": "env", "metrics": {"actual": {}}}]) is None


def test_a_gpu_smoke_report_names_the_devices_cuda_used_and_the_driver() -> None:
    spec = Spec(torch="2.15.0", python="3.11", flavor="slim", cuda="13.2")
    report = smoke_report(spec, "linux/amd64", D2)
    report["host"] |= {"driver": "580.95.05", "driver_cuda": "13.0", "cuda_devices": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory": 81559,
         "mig": False} for i in range(2)]}
    smoke = catalog.summarise("smoke", json.dumps(report).encode(), D1)
    for check in report["checks"]:
        check["status"] = "pass"
    smoke = catalog.summarise("smoke", json.dumps(report).encode(), D1)
    line = howto.smoke_verdict({"present": True, **smoke}, "cuda")["line"]
    assert line.startswith("pass on GPU: CUDA used 2 × NVIDIA H100 80GB HBM3 (sm 9.0, 80 GiB)")
    assert line.endswith("driver 580.95.05 (CUDA 13.0)")


def test_a_page_says_what_a_node_holding_a_sibling_or_the_last_build_pulls(
        tmp_path: Path) -> None:
    images = paged({D1: image(D1, {"numpy": "2.3.5"}), D2: image(D2, {"numpy": "2.3.6"}),
                    D4: image(D4, {}, flavor="slim")})
    doc = document(images, {"t": D2, "t-20261201": D1, "t-20261204": D2, "s": D4,
                          "s-20261204": D4})
    twins = {D2: {"linux/amd64": [{"digest": D5, "size": 50}, {"digest": D6, "size": 30}]},
             D4: {"linux/amd64": [{"digest": D5, "size": 50}]}}
    layer_reuse.add_pulls(doc["variants"], images, twins)
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    catalog_site.write_site(doc, tmp_path)
    page = (tmp_path / "tags" / "t.html").read_text()
    table = re.search(r'<table id="pull-from">(.*?)</table>', page, re.S)[1]
    rows = re.findall(r'<tr data-relation="([^"]+)">(.*?)</tr>', table, re.S)
    assert [(why, re.findall(r'data-bytes="(\d*)"', row)) for why, row in rows] == [
        ("flavor", ["40", "30"]),  # the slim node lacks D2's own layer; its twin, D6
        ("previous build", ["40", ""])]  # the build before has no twin
    assert "another flavor: slim" in table and "the build before (the weekly rebuild)" in table
    assert "pulls 100 B gzip / 80 B zstd" in page
    older = (tmp_path / "tags" / "t-20261201.html").read_text()
    assert 'id="pull-from"' not in older  # the first build: nothing held to compare with


class FakeRegistry:
    """The reads `catalog.collect` makes, from manifests held in memory (counted)."""

    def __init__(self) -> None:
        self.registry, self.reads = "r:5000", 0
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.blobs: dict[str, bytes] = {}
        self.tag_map: dict[str, str] = {}

    def put(self, doc: dict[str, Any], media_type: str, *tags: str) -> str:
        body = json.dumps(doc).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.manifests[digest] = (body, media_type)
        self.tag_map |= dict.fromkeys(tags, digest)
        return digest

    def image(self, spec: Spec, sizes: dict[str, int], media_type: str, *tags: str) -> str:
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Labels": spec.labels("linux/amd64", "0" * 40)},
                             "history": [{"created_by": CREATED_BY[g]} for g in sizes]}).encode()
        self.blobs[cdigest := "sha256:" + hashlib.sha256(config).hexdigest()] = config
        layers = [{"mediaType": media_type, "size": size,
                   "digest": "sha256:" + hashlib.sha256(f"{media_type}{g}{size}".encode())
                   .hexdigest()} for g, size in sizes.items()]
        return self.put({"schemaVersion": 2, "config": {"digest": cdigest, "size": len(config)},
                         "layers": layers}, oci.OCI_MANIFEST, *tags)

    def tags(self, repository: str) -> list[str]:
        return sorted(self.tag_map)

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        digest = self.tag_map.get(ref, ref)
        if digest not in self.manifests:  # e.g. no `sha256-<hex>` referrers index
            return None
        body, media_type = self.manifests[digest]
        return oci.Descriptor(digest, media_type, len(body))

    def manifest(self, repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        self.reads += 1
        desc = self.head(repository, ref)
        return None if desc is None else (self.manifests[desc.digest][0], desc)

    def config(self, repository: str, digest: str) -> dict[str, Any]:
        return json.loads(self.blobs[digest])

    def blob_tail(self, repository: str, digest: str, length: int) -> None:
        return None  # no range reads: the uncompressed size is unknown


def test_collect_reads_the_twins_layers_once_and_writes_each_pull(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = FakeRegistry()
    runtime, slim = (Spec(torch="2.13.0+cpu", python="3.11", flavor=f) for f in ("runtime", "slim"))
    old = {"base": 300, "python": 90, "torch": 3000, "packages": 40, "toolchain": 160}
    new = {**old, "packages": 43}
    zstd = "application/vnd.oci.image.layer.v1.tar+zstd"
    for spec, sizes, dated in ((runtime, old, "20261201"), (runtime, new, "20261204"),
                               (slim, {k: v for k, v in old.items() if k != "toolchain"},
                                "20261204")):
        tags = (spec.floating, f"{spec.floating}-{dated}")
        reg.image(spec, sizes, oci.OCI_LAYER_GZIP, *tags)
        reg.image(spec, {g: n // 2 for g, n in sizes.items()}, zstd, *(f"{t}-zstd" for t in tags))
    monkeypatch.setattr(catalog.oci, "Registry", lambda _: reg)
    source, cache = catalog.Source.parse("r:5000/torch"), tmp_path / "cache.json"
    doc, fetched = catalog.collect(source, tmp_path / "site", cache)
    assert fetched > 0
    [variant] = [v for v in doc["variants"] if v["tag"] == runtime.floating]
    [sibling] = variant["siblings"]
    assert (sibling["tag"], sibling["relation"]) == (slim.floating, "flavor")
    assert sibling["platforms"] == [{"platform": "linux/amd64", "gzip": 43 + 160,
                                     "gzip_full": 3593, "zstd": 21 + 80, "zstd_full": 1796}]
    rebuild = variant["history"][-1]["previous"]["platforms"][0]
    assert (rebuild["gzip"], rebuild["zstd"]) == (43, 21)  # the one package layer
    catalog_doc.validate(doc)
    reads = reg.reads
    assert catalog.collect(source, tmp_path / "site", cache)[1] == 0  # twins too are cached
    assert reg.reads == reads


def test_a_downgrade_is_called_a_downgrade_on_the_page(tmp_path: Path) -> None:
    """A rollback (numpy 2.3.6 → 2.3.5) is never counted as an upgrade."""
    images = paged({D1: image(D1, {"numpy": "2.3.6"}), D2: image(D2, {"numpy": "2.3.5"})})
    doc = document(images, {"t": D2, "t-20261201": D1, "t-20261204": D2})
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    catalog_site.write_site(doc, tmp_path)
    page = (tmp_path / "tags" / "t-20261204.html").read_text()
    assert "0 added, 0 removed, 0 upgraded, 1 downgraded" in page
    assert "pypi/numpy 2.3.6 → 2.3.5 (downgrade)" in page


def test_with_keys_a_dated_tag_is_history_only_when_a_trusted_signature_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone with push rights may write a dated tag (issue 40.2): with `--key`, one that no
    trusted signature of its digest names is no history (it is listed under other tags)."""
    from types import SimpleNamespace

    from builder.core import sign

    floating = "2.13.0-py3.11-cpu-runtime"
    signed = {D1: [{"optional": sign.tag_annotations(floating, [f"{floating}-20260101"])}]}

    def payloads(reg: Any, repository: str, digest: str, keys: Any) -> list[dict[str, Any]]:
        if digest not in signed:
            raise sign.SignatureError("published unsigned: no signature")
        return signed[digest]

    monkeypatch.setattr(sign, "verified_payloads", payloads)
    by_tag = {floating: D1, f"{floating}-20260101": D1, f"{floating}-20260102": D2,
              f"{floating}-20260102.1": D1}
    reader = SimpleNamespace(keys=[object()], reg=None, identities=(), trusted_root=None,
                             source=SimpleNamespace(repository="torch"))
    assert catalog.signed_dated(reader, by_tag) == {floating: D1, f"{floating}-20260101": D1}
    reader.keys = []
    assert catalog.signed_dated(reader, by_tag) == by_tag


class TwinReader:
    """`Reader.manifest` for twins: one platform manifest each, 70 bytes of layers + 5."""

    def manifest(self, digest: str) -> dict[str, Any]:
        return {"layers": [{"digest": digest, "size": 70}], "config_size": 5}


def test_every_dated_page_pins_its_own_zstd_twin_and_names_gzip_for_docker(
        tmp_path: Path) -> None:
    images = paged({D1: image(D1, {"numpy": "2.3.5"}), D2: image(D2, {"numpy": "2.3.6"}),
                    D4: image(D4, {"numpy": "2.3.4"})})
    doc = document(images, {"t": D2, "t-20261120": D4, "t-20261201": D1, "t-20261204": D2})
    twins = {"t-zstd": D6, "t-20261204-zstd": D6, "t-20261201-zstd": D5}  # 1120: none
    catalog.add_twins(TwinReader(), doc["variants"], images, twins)  # type: ignore[arg-type]
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    catalog_site.write_site(doc, tmp_path)
    older = (tmp_path / "tags" / "t-20261201.html").read_text()
    assert f"image: r:5000/torch@{D5}" in older  # the pod pins the older build's own twin
    assert f"use the gzip digest:\n      #   r:5000/torch@{D1}" in older
    assert "image: r:5000/torch:t-20261201-zstd" in older and "75 B" in older
    oldest = (tmp_path / "tags" / "t-20261120.html").read_text()
    assert f"image: r:5000/torch@{D4}" in oldest and "-zstd" not in oldest  # no twin: gzip
    for page in ("t.html", "t-20261204.html"):
        assert f"image: r:5000/torch@{D6}" in (tmp_path / "tags" / page).read_text()


def test_a_page_shows_the_bytes_needed_to_start_beside_the_pull_size(tmp_path: Path) -> None:
    images = paged({D1: image(D1, {"numpy": "2.3.5"}), D2: image(D2, {"numpy": "2.3.6"})})
    images[D2]["startup"] = {"bytes": 25, "image_bytes": 100, "share": 0.25, "files": 3,
                             "image_files": 9, "same_digest": True, "measured_on": D2,
                             "measured": "2026-12-06T04:10:00Z"}
    doc = document(images, {"t": D2, "t-20261201": D1, "t-20261204": D2})
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    catalog_site.write_site(doc, tmp_path)
    cell = re.compile(r'<td class="startup">(.*?)</td>')
    assert cell.findall((tmp_path / "tags" / "t.html").read_text()) == ["25 B (25% of 100 B), 3 files"]
    assert cell.findall((tmp_path / "tags" / "t-20261201.html").read_text()) == ["not measured"]


def test_a_fix_available_row_links_to_the_rebuild_that_took_it(tmp_path: Path) -> None:
    """Issue 41.7: a vulnerability with a fixed version in a dated build's audit names the first
    later dated build whose SBOM holds a fixed version; the page links to it."""
    audit = {"vulnerabilities": [{"id": "PYSEC-9", "name": "numpy", "version": "2.3.5",
                                  "fix_versions": ["2.3.6"], "aliases": ["CVE-2026-0009"]},
                                 {"id": "PYSEC-8", "name": "six", "version": "1.16.0"}],
             "sources": {"pypi": "ok"}, "unknown": []}
    summary = catalog_doc.audit_summary(audit)
    assert summary["fixes"] == [{"id": "PYSEC-9", "package": "numpy", "version": "2.3.5",
                                 "fixed": ["2.3.6"], "aliases": ["CVE-2026-0009"]}]
    images = paged({D1: image(D1, {"numpy": "2.3.5"}, vulns=2),
                    D2: image(D2, {"numpy": "2.3.5", "six": "1.17.0"}, vulns=2),
                    D4: image(D4, {"numpy": "2.3.6"}, vulns=0)})
    for digest in (D1, D2):
        images[digest]["platforms"][0]["evidence"]["audit"].update(summary)
    doc = document(images, {"t": D4, "t-20261201": D1, "t-20261202": D2, "t-20261204": D4})
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    [variant] = doc["variants"]
    assert [[f["taken_in"] for f in h["fixes"]] for h in variant["history"]] == [
        ["t-20261204"], ["t-20261204"], []]
    catalog_site.write_site(doc, tmp_path)
    page = (tmp_path / "tags" / "t-20261201.html").read_text()
    row = re.search(r'<tr class="fix">(.*?)</tr>', page, re.S)[1]  # type: ignore[index]
    assert "PYSEC-9" in row and "numpy 2.3.5" in row and "2.3.6" in row
    assert '<small class="cves">CVE-2026-0009</small>' in row  # the CVE ids the fix names
    assert 'href="../tags/t-20261204.html">t-20261204</a> (the rebuild that took it)' in row
    assert '<tr class="fix">' not in (tmp_path / "tags" / "t.html").read_text()
