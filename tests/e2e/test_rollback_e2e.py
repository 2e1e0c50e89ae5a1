"""`publish --rollback-to`, for real (issue 41.1): a deliberate rollback is signed, `verify --key`
reports it as a signed rollback (ok), the catalog names it and the key; a hand-moved tag, or a
rollback made stale by a newer publication, still fails. And the daily check (issue 41.7)
audits the publication afresh: a changed finding is attached, signed, and the catalog shows it.

The session's CPU runtime (fixtures_published: built and staged with signed evidence once, only
read) is published by its key on day 1 (`TORCH_IMAGES_NOW`), with its zstd twin, into a registry
of this module's own whose matrix trusts that key: nothing is built. The newer publication of
day 2 is made beside it as the pipeline would sign it (a tiny image wearing the real labels but
other content, and its twin, signed by the trusted key naming its dated tag, the floating tag and
the alias, those tags moved onto it): cheaper than a second build, and the same record to every
command. Then, on day 2, `publish --rollback-to` the day-1 publication.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fake_security_suite import FIXED, OLDER, security_suite
from fixtures_published import PASSWORD, Publication, moved_matrix, own_registry, republish
from helpers import Saved, fake_image, free_port, real_labels, run_builder
from packageurl import PackageURL

from builder.core import keypair, labels, oci, sign
from builder.model import tags as tag_rules

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
ALIAS = "latest-cpu-runtime"
DAY1, DAY2 = "2026-01-01T12:00:00Z", "2026-01-02T12:00:00Z"
OLD, NEW, NEWER = f"{CPU}-20260101", f"{CPU}-20260102", f"{CPU}-20260102.1"
MOVING = (CPU, ALIAS)


def twin(tag: str) -> str:
    return f"{tag}-zstd"


@pytest.fixture(scope="module")
def env(shared_publication: Publication, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, Any]]:
    """A registry of this module's own, a matrix trusting the session's key (an alias for the
    CPU runtime); the registry and its images removed afterwards."""
    tmp = tmp_path_factory.mktemp("rollback")
    shared = replace(shared_publication,
                     env={**shared_publication.env, "TORCH_IMAGES_NOW": DAY1})
    with own_registry(tmp) as addr:
        yield {"addr": addr, "tmp": tmp, "env": shared.env, "key": shared.key,
               "pub": shared.pub, "reg": oci.Registry(addr), "repo": shared.repository,
               "shared": shared, "matrix": moved_matrix(shared, tmp, addr,
                                                        trust_keys=[str(shared.pub)])}


def builder(env: dict[str, Any], *args: str, day: str = DAY2, check: bool = False
            ) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], env={**env["env"], "TORCH_IMAGES_NOW": day},
                       check=check)


def verify(env: dict[str, Any], tag: str) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", f"{env['addr']}/{env['repo']}:{tag}", "--key", str(env["pub"]),
                       env={**env["env"], "TORCH_IMAGES_NOW": DAY2}, check=False)


def head(env: dict[str, Any], tag: str) -> str | None:
    desc = env["reg"].head(env["repo"], tag)
    return desc.digest if desc else None


def ours(env: dict[str, Any]) -> keypair.SigningKey:
    return keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())


@pytest.fixture(scope="module")
def day1(env: dict[str, Any]) -> dict[str, Any]:
    """The real publication of day 1: the session's staged image published with the key (and
    its zstd twin) into this module's registry (fixtures_published.republish)."""
    (env["tmp"] / "day1").mkdir()
    pub = republish(env["shared"], env["tmp"] / "day1", env["addr"],
                    trust_keys=[str(env["pub"])]).record
    assert pub["dated_tag"] == OLD, pub
    assert head(env, twin(OLD)) is not None, "the matrix publishes zstd twins"
    return pub


CHECK = ("rebuild", "--check", "--json", "--skip-source", "debian-security", "--skip-source",
         "python-vuln", "--skip-source", "base-moved", "--skip-source", "inputs-changed")


def deb_in_sbom(reg: oci.Registry, repository: str, digest: str) -> tuple[str, str]:
    """(name, version) of a Debian package the attached SBOM lists (one without an epoch)."""
    doc = json.loads(reg.fetch_artifact(repository, digest, "sbom"))
    debs = sorted((p.name, p.version) for p in (PackageURL.from_string(c["purl"])
                                                for c in with_key(doc, "purl"))
                  if p.type == "deb" and p.version and ":" not in p.version)
    return next((d for d in debs if d[0] == "libc6"), debs[0])


def audit_tags(env: dict[str, Any], *digests: str) -> dict[str, str | None]:
    """`sha256-<hex>.audit` → the digest it points at, for each image digest."""
    tags = [oci.artifact_tag(d, "audit") for d in digests]
    return {tag: head(env, tag) for tag in tags}


def test_the_daily_check_audits_afresh_and_the_catalog_shows_the_new_debian_row(
        env, day1) -> None:
    """Issue 41.7: `rebuild --check --key` audits the signed SBOM again; with a (stand-in)
    security suite that has a newer version of one installed package, the findings changed:
    the new report is attached to the image and its twin, attested with the key, and the
    catalog shows its Debian row with the CVE ids from that package's changelog. A second check
    finds the same findings and attaches nothing; without a key it says so and attaches nothing.
    Before the rollback tests (the latest publication is day 1's); day 1's audit put back."""
    reg, digest, twin_digest = env["reg"], day1["digest"], head(env, twin(OLD))
    package, installed = deb_in_sbom(reg, env["repo"], digest)
    saved = Saved(env["addr"])
    for d in (digest, twin_digest):
        saved.keep(env["repo"], oci.artifact_tag(d, "audit"))
        saved.keep(env["repo"], sign.att_tag(d))
    try:
        with security_suite(package, installed) as suite:
            mirror = {**env["env"], "BUILDER_DEBIAN_SECURITY_MIRROR": suite.url}
            first = run_builder(*CHECK, "--key", str(env["key"]), matrix=env["matrix"],
                                env=mirror)
            [audit] = json.loads(first.stdout)["audits"]
            print(audit["refresh"], audit["refresh_detail"], first.stderr[-500:], sep="\n")
            assert audit["refresh"] == "attached", audit
            [row] = [f for f in audit["fixes"] if f["package"] == package]
            print(f"check: {row['id']} in {package} {installed}: {row['aliases']}")
            assert row["aliases"] == list(FIXED) and row["fixed"] == [suite.newer], row
            report = json.loads(reg.fetch_artifact(env["repo"], digest, "audit"))
            attested, _ = sign.verified_attestations(reg, env["repo"], digest,
                                                     [keypair.load_public(env["pub"])])
            assert attested["audit"]["predicate"]["scanner"]["result"] == report
            assert json.loads(reg.fetch_artifact(env["repo"], twin_digest, "audit")) == report
            attached = audit_tags(env, digest, twin_digest)
            site = env["tmp"] / "daily-site"
            run_builder("catalog", f"{env['addr']}/{env['repo']}", "--out", str(site), "--key",
                        str(env["pub"]), env=env["env"])
            doc = json.loads((site / "catalog.json").read_text())
            [entry] = [e for e in with_key(doc, "fixes") if e.get("tag") == OLD]
            [shown] = [f for f in entry["fixes"] if f["package"] == package]
            print(f"catalog ({OLD}): {shown}")
            assert shown["aliases"] == list(FIXED) and OLDER not in shown["aliases"], shown
            page = (site / "tags" / f"{OLD}.html").read_text()
            assert f'<small class="cves">{" ".join(FIXED)}</small>' in page
            again = json.loads(run_builder(*CHECK, "--key", str(env["key"]),
                                           matrix=env["matrix"], env=mirror).stdout)
            print("second check:", again["audits"][0]["refresh"], again["audits"][0]["refresh_detail"])
            assert again["audits"][0]["refresh"] == "unchanged", again["audits"]
            assert audit_tags(env, digest, twin_digest) == attached
        closed = {**env["env"], "BUILDER_DEBIAN_SECURITY_MIRROR": f"http://127.0.0.1:{free_port()}"}
        keyless = run_builder(*CHECK, "--trust-key", str(env["pub"]), matrix=env["matrix"],
                              env=closed)
        print(keyless.stderr[-500:])
        assert json.loads(keyless.stdout)["audits"][0]["refresh"] == "not attached"
        assert "fresh audits not attached: no signing key" in keyless.stderr
        assert audit_tags(env, digest, twin_digest) == attached
    finally:
        saved.restore()


def newer_publication(env: dict[str, Any], day1: dict[str, Any], dated: str,
                      content_hash: str) -> dict[str, str]:
    """A newer publication as the pipeline signs and tags it: other content (a tiny image with
    the real labels), its twin, each signed naming its tags, then the tags moved onto them."""
    reg = env["reg"]
    found = real_labels(reg, env["repo"], day1["digest"]) | {labels.CONTENT_HASH: content_hash}
    tags = [dated, tag_rules.HASH_TAG_PREFIX + content_hash[:20], *MOVING]
    made = {}
    for name, names in (("gzip", tags), ("zstd", [twin(t) for t in tags])):
        digest = fake_image(reg, env["repo"], found)
        sign.sign_image(reg, env["repo"], digest, ours(env), sign.tag_annotations(CPU, names))
        for tag in names:
            reg.tag(env["repo"], digest, tag)
        made[name] = digest
    return made


def pullable_image(reg: oci.Registry, repository: str, found: dict[str, str]) -> str:
    """A tiny image the engine can pull (one real gzip tar layer, a valid `created`) wearing
    `found` labels: what `rebuild --check` reads a publication's content hash from."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        info = tarfile.TarInfo("newer")
        info.size = 3
        t.addfile(info, io.BytesIO(b"new"))
    layer = gzip.compress(tar.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": DAY2,
                         "config": {"Labels": found}, "rootfs": {
                             "type": "layers", "diff_ids": [oci.sha256(tar.getvalue())]}}).encode()
    body = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                       "config": {"mediaType": oci.OCI_CONFIG, "size": len(config),
                                  "digest": reg.push_blob(repository, config)},
                       "layers": [{"mediaType": oci.OCI_LAYER_GZIP, "size": len(layer),
                                   "digest": reg.push_blob(repository, layer)}]}).encode()
    return reg.put_manifest(repository, oci.sha256(body), body, oci.OCI_MANIFEST)


def test_a_rebuild_from_a_checkout_behind_the_registry_moves_nothing(env, day1) -> None:
    """Issue 41.1: the registry's newest signed publication (`OLD.1`, as a later rebuild's
    publish signed and tagged it) is newer than what this checkout's lock builds (day 1's
    content): `builder rebuild --key` rebuilds it (the session image's id: the shared state's
    smoke report and SBOM are reused, never made twice), and its publish refuses with the
    update-the-checkout hint, exit 1, no tag moved. Before the rollback tests: their newer
    publication (`NEW`) comes after this one."""
    behind = f"{OLD}.1"
    found = real_labels(env["reg"], env["repo"], day1["digest"]) | {labels.CONTENT_HASH: "4" * 64}
    digest = pullable_image(env["reg"], env["repo"], found)
    tags = [behind, tag_rules.HASH_TAG_PREFIX + "4" * 20, *MOVING]
    sign.sign_image(env["reg"], env["repo"], digest, ours(env), sign.tag_annotations(CPU, tags))
    for tag in tags:  # as that rebuild's publish moved them
        env["reg"].tag(env["repo"], digest, tag)
    before = {tag: head(env, tag) for tag in env["reg"].tags(env["repo"])}
    today = {k: v for k, v in env["env"].items() if k != "TORCH_IMAGES_NOW"}  # today's base
    result = run_builder("rebuild", "--key", str(env["key"]), "--skip-source", "debian-security",
                         "--skip-source", "python-vuln", "--skip-source", "base-moved",
                         "--skip-source", "tag-drift", matrix=env["matrix"], env=today,
                         check=False)
    out = result.stdout + result.stderr
    print(next((line for line in out.splitlines() if "update the checkout" in line), out[-3000:]))
    assert result.returncode == 1 and "update the checkout" in out, out[-5000:]
    assert f"`{behind}`" in out, out[-5000:]
    assert {tag: head(env, tag) for tag in env["reg"].tags(env["repo"])} == before
    assert "reused the smoke report and SBOM" in result.stderr, result.stderr[-3000:]


@pytest.fixture(scope="module")
def rolled(env: dict[str, Any], day1: dict[str, Any]) -> dict[str, Any]:
    """Day 2: a newer publication, then `publish --rollback-to` the day-1 one."""
    newer = newer_publication(env, day1, NEW, "1" * 64)
    result = builder(env, "publish", "--rollback-to", OLD, "--key", str(env["key"]), "--json")
    return {"newer": newer, "run": result}


def test_rollback_moves_the_floating_tag_alias_and_twins_back(env, day1, rolled) -> None:
    result = rolled["run"]
    assert result.returncode == 0, result.stdout + result.stderr
    [row] = json.loads(result.stdout)
    assert row["status"] == "rolled-back" and row["rollback_from"] == NEW, row
    old_twin = head(env, twin(OLD))
    for tag in MOVING:
        assert head(env, tag) == day1["digest"], tag
        assert head(env, twin(tag)) == old_twin, twin(tag)
    assert head(env, NEW) == rolled["newer"]["gzip"]  # dated tags never move


def test_verify_reports_the_signed_rollback(env, rolled) -> None:
    for tag in (*MOVING, twin(CPU)):
        result = verify(env, tag)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "signed rollback" in result.stdout, result.stdout
        assert "tag rollback" not in result.stdout, result.stdout


@pytest.fixture(scope="module")
def catalog(env: dict[str, Any], rolled: dict[str, Any]) -> dict[str, Any]:
    """`builder catalog --key` of the repository after the rollback (day 2)."""
    site = env["tmp"] / "site"
    run_builder("catalog", f"{env['addr']}/{env['repo']}", "--out", str(site), "--key", str(env["pub"]),
                env={**env["env"], "TORCH_IMAGES_NOW": DAY2})
    return json.loads((site / "catalog.json").read_text())


def test_the_catalog_shows_the_rollback_by_the_key(env, day1, catalog) -> None:
    detail = catalog["images"][day1["digest"]]["signature"]["detail"]
    assert f"a signed rollback to `{OLD}` from `{NEW}`, made by that key" in detail, detail


def with_key(doc: Any, key: str) -> Iterator[dict[str, Any]]:
    """Every mapping in `doc` that has `key`."""
    if isinstance(doc, dict):
        if key in doc:
            yield doc
        for value in doc.values():
            yield from with_key(value, key)
    elif isinstance(doc, list):
        for value in doc:
            yield from with_key(value, key)


def sbom_python_names(reg: oci.Registry, repository: str, digest: str) -> set[str]:
    """The names of the PyPI packages the attached SBOM lists."""
    doc = json.loads(reg.fetch_artifact(repository, digest, "sbom"))
    return {PackageURL.from_string(c["purl"]).name for c in with_key(doc, "purl")
            if c["purl"].startswith("pkg:pypi/")}


def test_a_plain_publish_is_audited_signed_and_the_catalog_shows_it(env, day1, catalog) -> None:
    """No `audit --attach`: publish attached a report with its signed attestation; Debian rows
    name CVE ids from changelogs, Python rows are `unknown` where PyPI cannot be asked; the
    catalog shows the audit on the image and on its dated tag."""
    reg, digest = env["reg"], day1["digest"]
    report = json.loads(reg.fetch_artifact(env["repo"], digest, "audit"))
    attested, _ = sign.verified_attestations(reg, env["repo"], digest,
                                             [keypair.load_public(env["pub"])])
    assert attested["audit"]["predicate"]["scanner"]["result"] == report
    print(json.dumps(report["sources"], indent=2), len(report["vulnerabilities"]),
          len(report["unknown"]))
    debian = [v for v in report["vulnerabilities"] if v["source"] == "debian-security"]
    assert all(a.startswith(("CVE-", "DSA-", "DLA-")) for v in debian for a in v["aliases"])
    if report["sources"]["pypi"]["status"] != "ok":
        python = sbom_python_names(reg, env["repo"], digest)
        assert python and python <= {u["name"] for u in report["unknown"]}, report["unknown"]
        assert not report["ok"]  # never a clean bill
    [image] = catalog["images"][digest]["platforms"]
    assert image["audit"]["state"] != "not audited" and image["audit"]["from"] == "audit"
    dated = [e for e in with_key(catalog, "audit") if e.get("tag") == OLD]
    assert dated and all(e["audit"] == image["audit"]["state"] for e in dated), dated


def test_rollback_to_the_newest_or_an_unsigned_tag_is_refused(env, day1, rolled) -> None:
    for dated, why in ((NEW, "nothing to roll back"), (f"{CPU}-20250101", "no publication")):
        result = builder(env, "publish", "--rollback-to", dated, "--key", str(env["key"]))
        assert result.returncode == 2 and why in result.stderr, result.stderr


def test_a_hand_moved_tag_still_fails(env, day1, rolled) -> None:
    """The floating tag moved by hand to another old signed publication: no rollback
    signature names that move, so verify reports the rollback."""
    saved = Saved(env["addr"])
    try:
        for tag in MOVING:  # as the rollback left them
            saved.keep(env["repo"], tag)
            saved.keep(env["repo"], twin(tag))
        older = newer_publication(env, day1, f"{CPU}-20251231", "2" * 64)["gzip"]
        for tag in MOVING:  # newer_publication moved them; the floating tag goes to `older`
            env["reg"].tag(env["repo"], older if tag == CPU else day1["digest"], tag)
        moved = verify(env, CPU)
        assert moved.returncode == 1 and f"`{CPU}` is rolled back" in moved.stdout, moved.stdout
    finally:
        saved.restore()
    assert head(env, CPU) == day1["digest"]


def test_a_rollback_made_stale_by_a_newer_publication_fails(env, day1, rolled) -> None:
    """Last (it adds a publication): after a newer publication, the old rollback signature
    (rollback-from: the day-2 one) no longer excuses the floating tag on day 1's digest."""
    newer_publication(env, day1, NEWER, "3" * 64)
    env["reg"].tag(env["repo"], day1["digest"], CPU)  # moved back by hand, with the old signature
    stale = verify(env, CPU)
    assert stale.returncode == 1 and f"`{CPU}` is rolled back" in stale.stdout, stale.stdout
    assert f"`{NEWER}`" in stale.stdout, stale.stdout
