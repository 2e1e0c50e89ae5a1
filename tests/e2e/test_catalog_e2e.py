"""`builder catalog` end to end: a real registry holding images published as the pipeline
publishes them (bench/catalog_images.py: FROM-scratch images with the pipeline's labels, layer
history and attached SBOM, smoke report and provenance), the site it writes, and that site in
headless Chromium (Debian's `chromium`): screenshots, the chooser, the page without JavaScript,
the changelog, links and the console.

Set CATALOG_SCREENSHOTS=docs to refresh the README's screenshots from this run.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from helpers import ROOT, free_port, missing, run_builder

from bench import catalog_images as ci
from builder.core import keypair, oci
from builder.model import catalog_doc

REPO = "catalog-e2e"
CPU_OLD = ci.Spec(torch="2.13.0+cpu", python="3.11", flavor="runtime",
                  packages={"numpy": "2.3.5", "filelock": "3.20.0"})
CPU_NEW = ci.Spec(torch="2.13.0+cpu", python="3.11", flavor="runtime",
                  packages={"numpy": "2.3.5", "filelock": "3.20.1"})  # the one-package change
CPU_SLIM = ci.Spec(torch="2.13.0+cpu", python="3.11", flavor="slim")
CUDA13_ARM = ci.Spec(torch="2.15.0", python="3.11", flavor="slim", cuda="13.2",
                     platforms=("linux/amd64", "linux/arm64"))
CUDA12 = ci.Spec(torch="2.9.1", python="3.11", flavor="runtime", cuda="12.8")


@dataclass(frozen=True)
class Site:
    out: Path
    source: str
    digests: dict[str, str]  # floating tag → digest
    pub: Path  # the cosign public key of the signed image


@pytest.fixture(scope="module")
def site(registry_addr: str, tmp_path_factory: pytest.TempPathFactory) -> Site:
    """Two dated builds of the CPU runtime (the second after a one-package change, rebuilt for a
    python vulnerability, signed), its slim sibling, a CUDA 13.2 slim index with linux/arm64 and
    a CUDA 12.8 runtime, all but the last with `-zstd` twins; then `builder catalog` of that
    repository."""
    reg = oci.Registry(registry_addr)
    key = ci.signing_key()
    ci.publish(reg, REPO, CPU_OLD, "20261201", vulnerabilities=2, zstd=True)
    digests = {CPU_NEW.floating: ci.publish(reg, REPO, CPU_NEW, "20261204", key=key,
                                            reasons=("python-vuln",), vulnerabilities=0,
                                            zstd=True)}
    for spec in (CPU_SLIM, CUDA13_ARM, CUDA12):
        digests[spec.floating] = ci.publish(reg, REPO, spec, "20261204", zstd=spec != CUDA12)
    folder = tmp_path_factory.mktemp("catalog")
    pub = folder / "cosign.pub"
    pub.write_bytes(keypair.public_pem(key.public))
    out = folder / "site"
    result = json.loads(run_builder("catalog", f"{registry_addr}/{REPO}", "--out", str(out),
                                    "--json", "--no-startup").stdout)
    assert result["fetched"] > 0 and result["tags"] == 9 and result["variants"] == 4
    return Site(out, f"{registry_addr}/{REPO}", digests, pub)


# ---- the files ----------------------------------------------------------------------------


def test_catalog_json_matches_the_shipped_schema_and_says_what_was_published(site: Site) -> None:
    doc = json.loads((site.out / "catalog.json").read_text())
    jsonschema.Draft202012Validator(json.loads(catalog_doc.SCHEMA_PATH.read_text())).validate(doc)
    cuda = doc["images"][site.digests[CUDA13_ARM.floating]]
    assert cuda["index"] and [p["platform"] for p in cuda["platforms"]] == [
        "linux/amd64", "linux/arm64"]
    assert (cuda["cuda"], cuda["min_driver"]) == ("13.2", "580.65.06")
    assert {p["evidence"]["smoke"]["status"] for p in cuda["platforms"]} == {"pass"}
    first = cuda["platforms"][0]
    assert [la["group"] for la in first["layers"]] == CUDA13_ARM.groups
    assert first["uncompressed_size"] > first["size"] - 2000  # from the gzip trailers
    assert (site.out / first["evidence"]["sbom"]["href"]).is_file()


def test_a_second_run_fetches_nothing_and_rewrites_nothing(site: Site) -> None:
    before = {p: p.stat().st_mtime_ns for p in site.out.rglob("*") if p.is_file()}
    result = json.loads(run_builder("catalog", site.source, "--out", str(site.out),
                                    "--json", "--no-startup").stdout)
    assert (result["fetched"], result["files_written"]) == (0, 0)
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_the_fixture_images_pass_builder_verify_like_published_ones(site: Site) -> None:
    digest = site.digests[CPU_NEW.floating]
    run_builder("verify", f"{site.source}@{digest}", "--contents-only")  # exit 0: labels, smoke, SBOM, provenance


def test_with_the_key_the_signature_is_verified(site: Site, tmp_path: Path) -> None:
    out = tmp_path / "site"
    run_builder("catalog", site.source, "--out", str(out), "--key", str(site.pub))
    doc = json.loads((out / "catalog.json").read_text())
    signed = doc["images"][site.digests[CPU_NEW.floating]]["signature"]
    assert signed["verified"] is True and signed["attestations"] == ["https://cyclonedx.org/bom"]
    assert doc["images"][site.digests[CPU_SLIM.floating]]["signature"]["present"] is False
    page = (out / "tags" / f"{CPU_NEW.floating}.html").read_text()
    assert "verified</span>: cosign signature over" in page
    # The key it verified with is in the site, linked from each page beside the commands.
    assert (out / "keys" / "cosign.pub").read_bytes() == site.pub.read_bytes()
    assert 'href="../keys/cosign.pub" download' in page
    ref = f"{site.source}@{site.digests[CPU_NEW.floating]}"
    for command in (f"builder verify --key cosign.pub {ref}",
                    f"cosign verify --key cosign.pub --insecure-ignore-tlog=true {ref}",
                    "cosign verify-attestation --key cosign.pub --insecure-ignore-tlog=true "
                    f"--type https://cyclonedx.org/bom {ref}"):
        assert f">{command}</code>" in page
    index = (out / "index.html").read_text()
    assert "signed, verified" in index and "not signed" in index  # the signature column


def registry_pull(reg: oci.Registry, wanted: str, held: str) -> tuple[int, int]:
    """(bytes of `wanted`'s layers whose digests `held` lacks, how many such layers), read
    straight from the registry's manifests (single-platform tags)."""
    layers = {ref: json.loads(reg.manifest(REPO, ref)[0])["layers"] for ref in (wanted, held)}
    have = {layer["digest"] for layer in layers[held]}
    missing_layers = [layer for layer in layers[wanted] if layer["digest"] not in have]
    return sum(layer["size"] for layer in missing_layers), len(missing_layers)


def test_a_page_says_what_a_node_holding_a_sibling_or_the_last_build_pulls(
        site: Site, registry_addr: str) -> None:
    """Issue 35 item 4: the page's gzip and zstd bytes are the registry's non-shared layers."""
    reg = oci.Registry(registry_addr)
    page = (site.out / "tags" / f"{CPU_NEW.floating}.html").read_text()
    table = re.search(r'<table id="pull-from">(.*?)</table>', page, re.S)[1]
    rows = {held: (why, [int(n) for n in re.findall(r'data-bytes="(\d+)"', cells)])
            for why, held, cells in re.findall(
                r'<tr data-relation="([^"]+)"><td[^>]*><a href="[^"]*">([^<]+)</a>(.*?)</tr>',
                table, re.S)}
    old = f"{CPU_OLD.floating}-20261201"
    assert {held: why for held, (why, _) in rows.items()} == {
        CPU_SLIM.floating: "flavor", old: "previous build"}
    for held, (_, shown) in rows.items():
        expected = [registry_pull(reg, CPU_NEW.floating + suffix, held + suffix)
                    for suffix in ("", "-zstd")]
        assert shown == [n for n, _ in expected] and all(n > 0 for n in shown)
    # The weekly rebuild changed one package: one layer to pull, in either compression.
    assert [registry_pull(reg, CPU_NEW.floating + s, old + s)[1] for s in ("", "-zstd")] == [1, 1]
    doc = json.loads((site.out / "catalog.json").read_text())
    [variant] = [v for v in doc["variants"] if v["tag"] == CPU_NEW.floating]
    [sibling] = variant["siblings"]
    assert (sibling["tag"], sibling["platforms"][0]["gzip"], sibling["platforms"][0]["zstd"]) \
        == (CPU_SLIM.floating, *rows[CPU_SLIM.floating][1])
    assert variant["history"][-1]["previous"]["platforms"][0]["gzip"] == rows[old][1][0]
    assert "If your node already has" in page and "the build before (the weekly rebuild)" in page


def test_an_unknown_repository_is_one_error_line(registry_addr: str, tmp_path: Path) -> None:
    result = run_builder("catalog", f"{registry_addr}/nothing-here", "--out",
                         str(tmp_path / "site"), check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: `{registry_addr}/nothing-here` has no image tags")


# ---- in the browser -----------------------------------------------------------------------


def chromium() -> str:
    found = shutil.which("chromium")
    if not found:
        missing("no chromium (tools/setup.sh installs Debian's chromium)")
    return str(found)


def browse(page: Path, profile: Path, *args: str,
           query: str = "") -> subprocess.CompletedProcess[str]:
    """Headless Chromium on `page` (its own profile: other runs may use Chromium too)."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    result = subprocess.run([*argv, page.as_uri() + query], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def dom(site: Site, name: str, tmp_path: Path, query: str = "") -> str:
    result = browse(site.out / name, tmp_path / "profile", "--dump-dom", query=query)
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], f"console messages on {name}{query}: {console}"
    return result.stdout


def visible_rows(page: str) -> list[str]:
    """The data-tag of each index row the chooser left visible."""
    rows = re.findall(r"<tr ([^>]*data-tag=[^>]*)>", page)
    return [re.search(r'data-tag="([^"]+)"', r)[1] for r in rows if " hidden" not in r]


def test_driver_525_excludes_cuda_13_and_arm64_shows_only_arm64_images(
        site: Site, tmp_path: Path) -> None:
    everything = visible_rows(dom(site, "index.html", tmp_path))
    assert sorted(everything) == sorted(site.digests)
    old_driver = visible_rows(dom(site, "index.html", tmp_path, "?driver=525"))
    assert CUDA13_ARM.floating not in old_driver and CUDA12.floating not in old_driver
    assert {CPU_NEW.floating, CPU_SLIM.floating} <= set(old_driver)
    assert set(visible_rows(dom(site, "index.html", tmp_path, "?driver=575.51"))) == {
        CPU_NEW.floating, CPU_SLIM.floating, CUDA12.floating}  # 12.8 needs 570.26
    assert visible_rows(dom(site, "index.html", tmp_path, "?platform=linux%2Farm64")) == [
        CUDA13_ARM.floating]
    # A V100 (7.0): the CUDA 13 wheel has no sm_70 kernel, the CUDA 12.8 one has.
    assert visible_rows(dom(site, "index.html", tmp_path, "?driver=600&gpu=7.0")) == [
        CUDA12.floating]


def test_without_javascript_the_index_is_a_plain_table_sorted_by_links(
        site: Site, tmp_path: Path) -> None:
    # Headless Chromium cannot dump or shoot a page with scripts off, so the page as served is
    # read: it is what a browser without JavaScript shows.
    page = (site.out / "index.html").read_text()
    assert re.search(r'<form id="chooser"[^>]* hidden>', page)  # no form that cannot work
    assert "<noscript>" in page and sorted(visible_rows(page)) == sorted(site.digests)
    by_torch = visible_rows((site.out / "index-by-torch.html").read_text())
    assert by_torch[0] == CUDA12.floating and by_torch[-1] == CUDA13_ARM.floating  # 2.9 < 2.15
    # With scripts on, a heading keeps the choice: it links to the sorted page with the query.
    chosen = dom(site, "index.html", tmp_path, "?driver=525")
    assert re.search(r'href="[^"]*index-by-torch.html\?driver=525&amp;', chosen)


def test_the_changelog_of_the_second_build_names_the_changed_package(
        site: Site, tmp_path: Path) -> None:
    page = dom(site, f"tags/{CPU_NEW.floating}-20261204.html", tmp_path)
    row = re.search(r'<tr class="current">(.*?)</tr>', page, re.S)[1]
    assert "pypi/filelock 3.20.0 → 3.20.1" in row and "python-vuln" in row
    assert "python-vuln: fixed upstream" in row  # the detail `builder rebuild` attached
    assert "0 added, 0 removed, 1 upgraded" in row
    floating = dom(site, f"tags/{CPU_NEW.floating}.html", tmp_path)
    assert "2 vuln." in floating and "0 vuln." in floating  # the history chart
    assert "<svg" in floating and "g-toolchain" in floating  # the layer chart (runtime)


def test_a_cpu_image_is_not_applicable_and_a_cuda_one_smoked_without_gpu_is_a_stand_in(
        site: Site, tmp_path: Path) -> None:
    cpu = dom(site, f"tags/{CPU_SLIM.floating}.html", tmp_path)
    assert 'data-smoke="not-applicable"' in cpu and "GPU checks not applicable" in cpu
    assert re.search(r'<td class="status-na">not applicable</td>', cpu)
    assert "CPU stand-in" not in cpu and "substituted" not in cpu
    for spec in (CUDA12, CUDA13_ARM):
        page = dom(site, f"tags/{spec.floating}.html", tmp_path)
        assert re.search(r'<p class="status-standin verdict" data-smoke="stand-in">CPU stand-in',
                         page)
        assert "pass on GPU" not in page and "not yet checked on a GPU" in page
        assert 'class="status-standin">CPU stand-in</td>' in page
    index = dom(site, "index.html", tmp_path)
    summary = re.search(r'<p id="smoke-summary">(.*?)</p>', index, re.S)[1]
    assert "0 passed on a GPU" in summary and "2 CUDA images only with a CPU stand-in" in summary
    assert "2 CPU images (GPU checks not applicable)" in summary
    cells = re.findall(r'<td class="status-(\w+)" data-smoke="([\w-]+)"', index)
    assert sorted(cells) == [("pass", "not-applicable")] * 2 + [("standin", "stand-in")] * 2
    # Amber in the browser: the stand-in's colour is neither the pass nor the fail colour.
    css = (site.out / "style.css").read_text()
    assert "--standin: #9a6700" in css and ".status-standin { color: var(--standin)" in css


def test_an_image_page_says_how_to_run_and_verify_it_and_what_it_runs_as(
        site: Site, tmp_path: Path) -> None:
    digest = site.digests[CUDA12.floating]
    ref = f"{site.source}@{digest}"
    page = dom(site, f"tags/{CUDA12.floating}.html", tmp_path)
    assert f">docker run --rm -it --gpus all --shm-size=8g {ref}</code>" in page
    assert f"--ipc=host {ref}" in page
    pod = yaml.safe_load(html.unescape(re.search(r'<pre id="pod">(.*?)</pre>', page, re.S)[1]))
    [container] = pod["spec"]["containers"]
    assert container["image"] == ref and container["resources"]["limits"] == {
        "nvidia.com/gpu": 1}
    assert pod["spec"]["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    specs = dict(re.findall(r"<tr><th>([\w ]+)</th><td>(.*?)</td></tr>",
                            re.search(r'<table class="facts specs">(.*?)</table>', page, re.S)[1],
                            re.S))
    assert specs["user"] == "1000:1000 (uid 1000, not root)"
    assert specs["command"] == "<code>python</code>" and specs["entrypoint"] == "<code>none</code>"
    assert specs["working folder"] == "<code>/home/user</code>"
    assert specs["shell"].startswith("yes: bash 5.2.15-2+b7, dash")
    assert "/opt/venv/bin/python, first on PATH" in specs["python"]
    assert "VIRTUAL_ENV=/opt/venv" in specs["environment"]
    assert f">builder verify --key cosign.pub {ref}</code>" in page
    assert 'id="public-key"' in page  # without --key: says to ask the publisher for it
    assert "the build's fixed timestamp: the commit time of the lock" in page
    assert "published 2026-12-04 (its first dated tag)" in page
    # One component count, saying what it counts, and one SBOM per platform.
    assert "CycloneDX 1.6: 7 components (4 deb, 3 pypi; counted: components, nested" in page
    arm = dom(site, f"tags/{CUDA13_ARM.floating}.html", tmp_path)
    assert "Download the linux/amd64 SBOM" in arm and "Download the linux/arm64 SBOM" in arm


def test_an_older_dated_page_pins_its_own_zstd_twin_and_says_not_measured(site: Site) -> None:
    """Issue 42: every page's pod pins the twin of its own digest (here the first dated build,
    no longer floating), names the gzip digest for Docker 20.10; --no-startup (the site's runs
    ignore the checkout's bench/results.json): not measured."""
    dated = f"{CPU_OLD.floating}-20261201"
    reg = oci.Registry(site.source.split("/")[0])
    gzip, twin = (reg.head(REPO, tag).digest for tag in (dated, f"{dated}-zstd"))
    page = html.unescape((site.out / "tags" / f"{dated}.html").read_text())
    pod = yaml.safe_load(re.search(r'<pre id="pod">(.*?)</pre>', page, re.S)[1])
    assert pod["spec"]["containers"][0]["image"] == f"{site.source}@{twin}"
    assert f"on Docker 20.10 use the gzip digest:\n      #   {site.source}@{gzip}" in page
    assert f"image: {site.source}:{dated}-zstd" in page
    assert '<td class="startup">not measured</td>' in page


class Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [v for k, v in attrs if k in ("href", "src") and v]


def test_every_link_resolves_inside_the_site(site: Site) -> None:
    pages = sorted(site.out.rglob("*.html"))
    assert len(pages) >= 9 + 9  # 9 sorted indexes, a page per floating and dated tag
    broken = []
    for page in pages:
        parser = Links()
        parser.feed(page.read_text())
        for link in parser.found:
            if link.startswith(("data:", "#")):
                continue
            parts = urlsplit(link)
            target = (page.parent / parts.path).resolve()
            if parts.scheme or parts.netloc or not target.is_file() or \
                    site.out.resolve() not in target.parents:
                broken.append(f"{page.relative_to(site.out)}: {link}")
    assert broken == []


def test_screenshots_of_the_index_and_an_image_page(site: Site, tmp_path: Path) -> None:
    dark = "--blink-settings=preferredColorScheme=0"  # prefers-color-scheme: dark
    shots = {"catalog-index.png": ("index.html", "", "1280,760", ()),
             "catalog-chooser.png": ("index.html", "?driver=575.51", "1280,640", ()),
             "catalog-image.png": (f"tags/{CPU_NEW.floating}.html", "", "1280,3300", ()),
             "catalog-image-cuda.png": (f"tags/{CUDA12.floating}.html", "", "1280,3300", ()),
             "catalog-image-dark.png": (f"tags/{CUDA13_ARM.floating}.html", "", "1280,1800",
                                        (dark,))}
    keep = os.environ.get("CATALOG_SCREENSHOTS")
    for name, (page, query, size, extra) in shots.items():
        target = tmp_path / name
        browse(site.out / page, tmp_path / "profile", f"--screenshot={target}",
               f"--window-size={size}", *extra, query=query)
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 20_000
        if keep:
            shutil.copyfile(target, ROOT / keep / name)


def test_an_audit_attached_later_is_the_latest_audit_and_says_when_inconclusive(
        site: Site, tmp_path: Path) -> None:
    """Last in this file: it attaches to the registry the module's site was made from."""
    digest = site.digests[CPU_SLIM.floating]
    closed = f"http://127.0.0.1:{free_port()}"  # Debian's security mirror does not answer
    result = run_builder("audit", f"{site.source}@{digest}", "--attach", "--debian-mirror",
                         closed, check=False)
    assert result.returncode in (1, 2), result.stderr  # never "clean" with a source missing
    out = json.loads(run_builder("catalog", site.source, "--out", str(site.out),
                                 "--json", "--no-startup").stdout)
    assert out["fetched"] >= 1  # the new audit artifact, nothing else
    page = (site.out / "tags" / f"{CPU_SLIM.floating}.html").read_text()
    assert "Not conclusive</strong>: debian-security" in page
    # The history (chart and table) and the index give the same answer as the latest audit.
    assert 'data-audit="inconclusive"' in page
    row = re.search(r'<tr class="current">(.*?)</tr>', page.replace(
        f"tags/{CPU_SLIM.floating}.html", ""), re.S)
    table = re.search(r'<table id="history">(.*?)</table>', page, re.S)[1]
    assert '<td class="audit">inconclusive</td>' in table and "not audited" not in table
    chart = re.search(r"<svg[^>]*>.*?Size and vulnerabilities.*?</svg>", page, re.S)[0]
    assert ">inconclusive</text>" in chart and "not audited" not in chart
    assert row is None or "not audited" not in row[1]
    index = (site.out / "index.html").read_text()
    slim_row = re.search(rf'<tr data-tag="{re.escape(CPU_SLIM.floating)}".*?</tr>', index, re.S)[0]
    assert "not conclusive" in slim_row


def test_an_undated_hand_pushed_tag_is_listed_under_other_tags(registry_addr: str,
                                                               tmp_path: Path) -> None:
    """`skopeo copy … :scratch-test` of an image no dated tag names must not stop the site."""
    reg, repo = oci.Registry(registry_addr), f"{REPO}-scratch"
    ci.publish(reg, repo, CPU_SLIM, "20261204")
    scratch = ci.push_platform(reg, repo, CPU_OLD, "linux/amd64", "1" * 40)
    reg.tag(repo, scratch.digest, "scratch-test")
    out = tmp_path / "site"
    run_builder("catalog", f"{registry_addr}/{repo}", "--out", str(out))  # exit 0
    doc = json.loads((out / "catalog.json").read_text())
    assert doc["other_tags"] == [{"tag": "scratch-test", "digest": scratch.digest}]
    assert [v["tag"] for v in doc["variants"]] == [CPU_SLIM.floating]
    assert "<code>scratch-test</code>" in (out / "index.html").read_text()
