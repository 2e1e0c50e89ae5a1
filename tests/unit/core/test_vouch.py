"""Every reader that decides on signatures trusts a workflow identity alone (no key anywhere) as
it trusts a key, and refuses another identity saying so: the publish gate (staged evidence), the
registry record (which dated tags are publications), publish's dated tag, plan's `build-<hash>`,
`rebuild --check` (before it runs the image), the signed build cache and the signed base's
provenance. The bundles are real: builder's signer made them against the mock sigstore services
(tests/fixtures/sigstore_mock/publication, tests/e2e/make_keyless_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memregistry import MemoryRegistry
from records import publication

from builder.core import keyless, oci, sign, vouch
from builder.core.keypair import Identity, Vouchers
from builder.flows import rebuild_check, record
from builder.model import matrix
from builder.model.staged import Staged
from builder.stages import build, plan, publish, signed_base, signed_cache, staging

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sigstore_mock" / "publication"
ROOT = FIXTURE / "trusted_root.json"
DIGEST = "sha256:" + "ef" * 32
WORKFLOW = "https://github.com/torch-images/torch-images/.github/workflows/build.yml"
MAIN, DEV = f"{WORKFLOW}@refs/heads/main", f"{WORKFLOW}@refs/heads/dev"
VID = "2.13.0-py3.11-cpu-runtime"
DATED = f"{VID}-20261201"
TRUSTED = Vouchers(identities=(Identity(keyless.GITHUB_ISSUER, MAIN),), trusted_root=ROOT)
OTHER = Vouchers(identities=(Identity(keyless.GITHUB_ISSUER, DEV),), trusted_root=ROOT)
IMAGE = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST}).encode()


class ReferrerlessRegistry(MemoryRegistry):
    """distribution 2.8: no referrers API, so the `sha256-<hex>` fallback index; the image the
    bundles sign is DIGEST under each of its tags (the fixtures' subject is no real manifest)."""

    def referrers(self, repository: str, digest: str, artifact_type: str | None = None) -> None:
        return None

    def manifest(self, repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        found = super().manifest(repository, ref)
        if found is None or found[0] != IMAGE:
            return found
        return IMAGE, oci.Descriptor(DIGEST, oci.OCI_MANIFEST, len(IMAGE))


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> ReferrerlessRegistry:
    """The publication (image bundle naming its tags, its three evidence bundles) in `torch`,
    the same digest as the signed build cache in `torch-staging`; every reader's
    oci.Registry is this one."""
    found = ReferrerlessRegistry()
    for repository, tags, names in [("torch", [DATED, VID, "build-abc"],
                                     ["image", "sbom", "smoke", "provenance"]),
                                    ("torch-staging", [f"cache-{VID}"], ["cache"])]:
        found.manifests[(repository, DIGEST)] = IMAGE
        for tag in tags:
            found.tag(repository, DIGEST, tag)
        for name in names:
            keyless.attach(found, repository, DIGEST,
                           (FIXTURE / f"{name}.sigstore.json").read_bytes(), name)
    monkeypatch.setattr(oci, "Registry", lambda *_a, **_k: found)
    return found


def test_an_identity_alone_vouches_for_the_tags_its_image_bundle_names(reg) -> None:
    assert vouch.tags_signed_by(reg, "torch", DIGEST, TRUSTED) == {DATED, VID, "build-abc"}
    assert vouch.names_tag(reg, "torch", DIGEST, DATED, TRUSTED)
    assert not vouch.names_tag(reg, "torch", DIGEST, f"{VID}-20261202", TRUSTED)
    with pytest.raises(sign.SignatureError, match=f"another identity: signed by {MAIN}"):
        vouch.payloads(reg, "torch", DIGEST, OTHER)
    assert "identity" in vouch.describe(TRUSTED) and MAIN in vouch.describe(TRUSTED)


def test_an_image_bundle_naming_another_repository_names_no_tag_here(reg) -> None:
    """The cache bundle signs the same digest as `torch-staging`: not a publication of
    `torch` (as a `.sig` naming another repository is not)."""
    reg.manifests[("other", DIGEST)] = IMAGE
    keyless.attach(reg, "other", DIGEST, (FIXTURE / "image.sigstore.json").read_bytes(), "x")
    with pytest.raises(sign.SignatureError, match="naming another repository"):
        vouch.payloads(reg, "other", DIGEST, TRUSTED)


def test_the_registry_record_counts_an_identity_signed_dated_tag(reg) -> None:
    assert record.record_problem(reg, "torch", DIGEST, DATED, VID, TRUSTED) == ""
    assert "names" in record.record_problem(reg, "torch", DIGEST, f"{VID}-20261202", VID,
                                            TRUSTED)
    assert "another identity" in record.record_problem(reg, "torch", DIGEST, DATED, VID, OTHER)


def test_publish_never_overwrites_an_identity_signed_dated_tag(reg) -> None:
    other = "sha256:" + "12" * 32
    assert publish.dated_tag(reg, "torch", VID, "20261201", other, TRUSTED) == (
        f"{DATED}.1", False)
    assert publish.dated_tag(reg, "torch", VID, "20261201", other, OTHER) == (DATED, False)


def test_plan_counts_an_identity_signed_build_tag(reg, monkeypatch, capsys) -> None:
    monkeypatch.setattr(plan, "ask_registry", lambda *_a: True)
    m = matrix.load(Path(__file__).resolve().parents[3] / "matrix.yaml")
    assert plan.registry_holds(m, "build-abc", TRUSTED)
    assert not plan.registry_holds(m, "build-abc", OTHER)
    assert "not signed by a trusted key or identity" in capsys.readouterr().err


def test_the_publish_gate_reads_evidence_attested_by_an_identity(reg) -> None:
    staged = Staged(reg.registry, "torch", oci.Descriptor(DIGEST, oci.OCI_MANIFEST, 1), "id")
    files, problems = staging.signed(staged, TRUSTED)
    assert sorted(files) == ["provenance", "sbom", "smoke"] and problems == {}
    assert json.loads(files["smoke"])["status"] == "pass"
    files, problems = staging.signed(staged, OTHER)
    assert files == {} and "another identity" in problems["smoke"]


def test_rebuild_check_runs_only_an_image_a_trusted_identity_signed(reg) -> None:
    pub = publication(signed=True, reference=f"{reg.registry}/torch@{DIGEST}")
    assert rebuild_check.signature_problem(pub, TRUSTED) == ""
    refused = rebuild_check.signature_problem(pub, OTHER)
    assert refused.startswith("not run: its signature does not verify") and DEV in refused


def test_the_build_cache_is_taken_as_an_identity_signed_it(reg) -> None:
    m = matrix.load(Path(__file__).resolve().parents[3] / "matrix.yaml")
    ref = build.cache_ref(m, f"{m.registry}/{m.repository}:{VID}")
    chosen = signed_cache.choose(m, ref, TRUSTED, reg=reg)  # type: ignore[arg-type]
    assert chosen.refs == (f"{m.staging_registry}/torch-staging@{DIGEST}",)
    assert MAIN in chosen.line
    refused = signed_cache.choose(m, ref, OTHER, reg=reg)  # type: ignore[arg-type]
    assert refused.refs == () and "another identity" in refused.line


def test_the_signed_base_reads_a_provenance_an_identity_attested(reg) -> None:
    at = signed_base.Where(reg.registry, "torch", DATED)
    doc = signed_base.provenance(reg, at, DIGEST, TRUSTED)  # type: ignore[arg-type]
    assert doc == {"buildDefinition": {"buildType": "torch-images"}}
    with pytest.raises(signed_base.Unverified, match="another identity"):
        signed_base.provenance(reg, at, DIGEST, OTHER)  # type: ignore[arg-type]


def test_the_catalog_shows_as_history_the_dated_tags_a_trusted_identity_signed(reg) -> None:
    from builder.stages import catalog

    by_tag = {VID: DIGEST, DATED: DIGEST, f"{VID}-20261202": DIGEST}
    for trusted, history in [(TRUSTED, {VID: DIGEST, DATED: DIGEST}), (OTHER, {VID: DIGEST})]:
        reader = catalog.Reader(catalog.Source(reg.registry, "torch"), catalog.Cache(None),
                                Path("site"), [], ROOT, trusted.identities)
        reader.reg = reg
        assert catalog.signed_dated(reader, by_tag) == history


def test_of_several_identity_attested_audits_the_newest_scan_is_read(monkeypatch) -> None:
    """Bundles are only ever added (the daily check adds an audit when the findings change):
    the newest audit by its scan time is the one read; of other kinds, the first listed."""
    def audit(when: str) -> dict:
        return {"predicateType": sign.ATTESTED["audit"],
                "predicate": staging.vuln_predicate({"audited_at": when})}

    sbom = {"predicateType": sign.PREDICATES["sbom"], "predicate": {"n": 1}}
    listed = [audit("2026-12-01T04:17:00Z"), sbom, audit("2026-12-06T04:17:00Z"),
              {**sbom, "predicate": {"n": 2}}, audit("2026-12-03T04:17:00Z")]
    monkeypatch.setattr(vouch.keyless, "checked",
                        lambda *a: ([(s, None) for s in listed], ["one refused"]))
    found, problems = vouch.attestations(MemoryRegistry(), "torch", DIGEST, TRUSTED)
    assert found["audit"]["predicate"]["metadata"]["scanFinishedOn"] == "2026-12-06T04:17:00Z"
    assert found["sbom"]["predicate"] == {"n": 1} and "sbom" not in problems
