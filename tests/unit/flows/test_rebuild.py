"""`builder rebuild`: the sources' decisions with faked sources (`rebuild_check`), exit codes, the
rebuild loop."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from matrix_files import LOCKS, ROOT
from records import publication

from builder import cli
from builder.commands import rebuild as rebuild_cmd
from builder.core import keypair, labels, sign
from builder.core.errors import BuilderError
from builder.flows import rebuild
from builder.flows import rebuild_check as checking
from builder.model.matrix import Base, Variant

CPU = Variant(torch="2.13.0+cpu", python="3.11", accelerator="cpu", flavor="runtime",
              base=Base("mmdebstrap:bookworm"))
VID = CPU.id
BASE_OLD = "sha256:" + "a" * 64
HASH = "c" * 64
PUB = publication(content_hash=HASH)


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Every source answers and finds nothing; tests override one source at a time."""
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))
    info = {"Config": {"Labels": {checking.BASE_DIGEST_LABEL: BASE_OLD,
                                  labels.CONTENT_HASH: HASH}}}
    for module in (checking, rebuild, rebuild_cmd):
        monkeypatch.setattr(module, "latest_publications", lambda *_a, **_k: {VID: PUB})
    monkeypatch.setattr(checking, "published_image", lambda pub: (pub.reference, info))
    monkeypatch.setattr(checking, "debian_upgradable", lambda image: {})
    monkeypatch.setattr(checking, "audit_lock", lambda path: {"vulns": [], "unknown": []})
    monkeypatch.setattr(checking, "base_digest_now", lambda variant: BASE_OLD)
    monkeypatch.setattr(checking, "planned_hash", lambda *a: HASH)
    # the published SBOM: numpy one patch release older than the shipped lock pins
    monkeypatch.setattr(checking, "artifact_json_by_digest", lambda *a: {"components": [
        {"name": "numpy", "version": "2.4.5", "purl": "pkg:pypi/numpy@2.4.5"}]})
    monkeypatch.setattr(checking.plan, "smoke_files_hash", lambda: "s")
    monkeypatch.setattr(checking.tag_repair, "drift", lambda *a: [])
    monkeypatch.setattr(checking.resign, "lost", lambda *a: None)
    monkeypatch.setattr(checking.plan, "aliases_of", lambda *a: ["latest"])
    return monkeypatch


def run_check() -> list[checking.Finding]:
    return checking.check(None, [CPU])  # type: ignore[arg-type]


def test_all_clean_exits_0(clean) -> None:
    findings = run_check()
    assert findings == []
    assert checking.exit_code(findings) == 0


def test_a_moved_floating_tag_is_tag_drift_not_a_rebuild(clean) -> None:
    moved = ("sha256:" + "9" * 64, PUB.digest)
    clean.setattr(checking.tag_repair, "drift",
                  lambda reg, pub, moving, keys: [(moving[0], *moved), (moving[0] + "-zstd", "",
                                                                         PUB.digest)])
    findings = run_check()
    assert [(f.reason, f.status, f.data["tag"]) for f in findings] == [
        ("tag-drift", "repair", PUB.floating_tag), ("tag-drift", "repair",
                                                     PUB.floating_tag + "-zstd")]
    assert f"`{PUB.floating_tag}` points at sha256:999999999999, not {PUB.digest[:19]}" \
        in findings[0].detail
    assert "points at nothing" in findings[1].detail
    assert checking.exit_code(findings) == 1
    assert checking.source_summary(findings)["tag-drift"] == "repair"
    assert not rebuild.plan_actions(findings)  # nothing to rebuild: publish repairs it


def test_a_lost_signature_with_a_signed_copy_is_tag_drift(clean) -> None:
    """A newer publication's `.sig` was overwritten (resign.lost): `publish` re-attaches it; the
    tags are not compared with the older publication the record falls back on meanwhile."""
    lost = publication(content_hash=HASH, digest="sha256:" + "7" * 64, dated_tag=f"{VID}-20261206")
    clean.setattr(checking.resign, "lost", lambda *a: (lost, []))
    clean.setattr(checking.tag_repair, "drift", lambda *a: pytest.fail("compared"))
    [finding] = [f for f in run_check() if f.reason == "tag-drift"]
    assert (finding.status, finding.data["tag"]) == ("repair", sign.sig_tag(lost.digest))
    assert finding.detail.startswith(f"`{VID}-20261206` (sha256:777777777777) lost its signature")


def test_debian_updates_need_rebuild(clean) -> None:
    clean.setattr(checking, "debian_upgradable",
                  lambda image: {"libssl3": ("3.0.14-1~deb12u2", "3.0.15-1~deb12u1")})
    [f] = run_check()
    assert (f.reason, f.status) == ("debian-security", "rebuild")
    assert "libssl3 3.0.14-1~deb12u2→3.0.15-1~deb12u1" in f.detail
    assert f.data["token"].split("-")[0].isdigit()
    assert checking.exit_code([f]) == 1


def test_python_vuln_with_fix_and_torch_is_matrix_change(clean) -> None:
    vulns = [
        {"name": "jinja2", "version": "3.1.4", "id": "GHSA-x", "fix_versions": ["3.1.5"]},
        {"name": "torch", "version": "2.13.0+cpu", "id": "PYSEC-t", "fix_versions": ["2.14.0"]},
        {"name": "numpy", "version": "2.0.0", "id": "GHSA-nofix", "fix_versions": []},
    ]
    clean.setattr(checking, "audit_lock", lambda path: {"vulns": vulns, "unknown": []})
    findings = run_check()
    assert [(f.data["name"], f.status) for f in findings] == [
        ("jinja2", "rebuild"), ("torch", "matrix-change")]
    assert "3.1.5" in findings[0].detail and "GHSA-x" in findings[0].detail
    assert checking.exit_code(findings) == 1
    [action] = rebuild.plan_actions(findings)
    assert action.upgrade == ["jinja2"] and action.reasons == ["python-vuln"]


def test_base_moved_and_inputs_changed(clean) -> None:
    shipped = (Path(__file__).resolve().parents[3] / "locks" / f"{VID}.txt").read_text()
    clean.setattr(checking.lockfile, "require_lock", lambda *_a: SimpleNamespace(text=shipped))
    clean.setattr(checking, "base_digest_now", lambda variant: "sha256:" + "b" * 64)
    clean.setattr(checking, "planned_hash", lambda *a: "f" * 64)
    findings = run_check()
    assert {f.reason for f in findings} == {"base-moved", "inputs-changed"}
    assert all(f.status == "rebuild" for f in findings)
    [inputs] = [f for f in findings if f.reason == "inputs-changed"]
    assert inputs.detail.startswith("numpy 2.4.5→2.4.6; content hash ")  # what moved, first
    assert inputs.data["packages"] == {"numpy": {"old": "2.4.5", "new": "2.4.6"}}


@pytest.mark.parametrize("source", ["debian_upgradable", "audit_lock", "base_digest_now",
                                    "planned_hash"])
def test_a_failing_source_is_unknown_never_clean(clean, source: str) -> None:
    def boom(*a, **k):
        raise checking.SourceError("unreachable: no network")

    clean.setattr(checking, source, boom)
    findings = run_check()
    assert findings and all(f.status == "unknown" for f in findings)
    assert "unreachable" in findings[0].detail
    assert checking.exit_code(findings) == 2


def test_unreachable_image_makes_image_sources_unknown(clean) -> None:
    def no_image(pub):
        raise checking.SourceError("cannot pull")

    clean.setattr(checking, "published_image", no_image)
    findings = run_check()
    assert {f.reason for f in findings} == {"debian-security", "base-moved", "inputs-changed"}
    assert checking.exit_code(findings) == 2


def test_a_rebuild_wins_over_an_unknown_source_and_local_versions_stay_unknown(clean) -> None:
    clean.setattr(checking, "debian_upgradable", lambda image: {"zlib1g": ("1", "2")})
    clean.setattr(checking, "audit_lock", lambda path: {"vulns": [], "unknown": [
        {"name": "torch", "version": "2.13.0+cpu", "reason": "not on PyPI"}]})
    findings = run_check()
    assert checking.exit_code(findings) == 1  # one unknown feed never blocks a rebuild
    assert [f.status for f in findings] == ["rebuild", "unknown"]
    assert checking.exit_code([f for f in findings if f.status == "unknown"]) == 2


def test_missing_label_is_unknown(clean) -> None:
    clean.setattr(checking, "published_image",
                  lambda pub: (pub.reference, {"Config": {"Labels": {
                      labels.CONTENT_HASH: HASH}}}))
    findings = run_check()
    assert any(f.reason == "base-moved" and f.status == "unknown" for f in findings)


def test_parse_upgradable_both_formats() -> None:
    text = """Listing...
libssl3/stable-security 3.0.15-1~deb12u1 amd64 [upgradable from: 3.0.14-1~deb12u2]
Inst libc6 [2.36-9+deb12u7] (2.36-9+deb12u9 Debian-Security:12/stable-security [amd64])
Conf libc6 (2.36-9+deb12u9 Debian-Security:12/stable-security [amd64])
"""
    assert checking.parse_upgradable(text) == {
        "libc6": ("2.36-9+deb12u7", "2.36-9+deb12u9"),
        "libssl3": ("3.0.14-1~deb12u2", "3.0.15-1~deb12u1"),
    }
    assert checking.parse_upgradable("Listing...\n") == {}


def test_apt_token_changes_with_list() -> None:
    a = checking.apt_token({"x": ("1", "2")}, "20261206")
    assert a != checking.apt_token({"x": ("1", "3")}, "20261206")
    assert a == checking.apt_token({"x": ("1", "2")}, "20261206")


# ---- the rebuild loop -------------------------------------------------------------------------


def asked(**kw) -> rebuild.RebuildOptions:
    """A rebuild of CPU; `kw`: its findings, its fake build and publish flows, its switches."""
    return rebuild.RebuildOptions(matrix=None, variants=[CPU], manifest=Path("p.json"),  # type: ignore[arg-type]
                                  locks_dir=Path("locks"), **kw)


def test_the_default_flows_are_read_when_the_options_are_made(monkeypatch) -> None:
    """Not when the module was imported: a flow patched before the options are made is used."""
    def fake_build(*_a):
        return []

    def fake_publish(*_a, **_k):
        return []

    monkeypatch.setattr(rebuild.build_flow, "build_images", fake_build)
    monkeypatch.setattr(rebuild.publish_flow, "publish_variants", fake_publish)
    made = asked()
    assert (made.build, made.publish) == (fake_build, fake_publish)


def test_nothing_to_do_builds_and_pushes_nothing(clean) -> None:
    def fail(*a, **k):
        raise AssertionError("must not be called")

    actions = rebuild.rebuild(asked(findings=[], build=fail, publish=fail))
    assert actions == []


def test_rebuild_builds_with_apt_refresh_and_publishes(clean, tmp_path: Path) -> None:
    findings = [checking.Finding(variant_id=VID, reason="debian-security", status="rebuild", detail="x", data={"token": "20250101-ab"}),
                checking.Finding(variant_id="other", reason="base-moved", status="unknown", detail="err")]
    built, published = [], []
    new_sbom = tmp_path / "new.json"
    new_sbom.write_text(json.dumps({"components": [
        {"type": "library", "name": "libssl3", "version": "2",
         "purl": "pkg:deb/debian/libssl3@2"}]}))
    old = {"components": [{"type": "library", "name": "libssl3", "version": "1",
                           "purl": "pkg:deb/debian/libssl3@1"}]}

    def build(matrix, variants, options):
        built.append((variants, options))
        return [SimpleNamespace(state="built", message="", sbom_path=str(new_sbom),
                                planned="planned")]

    def publish_fn(matrix, planned, **kw):
        published.append({"planned": planned, **kw})
        return [{"id": VID, "status": "published", "tags": ["t-20250101"]}]

    clean.setattr(rebuild, "old_sbom", lambda pub: old)
    actions = rebuild.rebuild(asked(findings=findings, build=build, publish=publish_fn,
                                    allow_cpu_smoke=True))
    [a] = actions
    assert a.state == "published"
    [(variants, options)] = built
    assert variants == [CPU] and options.apt_refresh == "20250101-ab" and options.force
    assert options.smoke and options.sbom and options.locks == Path("locks")
    assert published == [{"planned": ["planned"], "allow_cpu_smoke": True, "dry_run": False,
                          "manifest": Path("p.json"), "locks_dir": Path("locks"),
                          "trust": keypair.UNSIGNED}]
    assert a.changelog["changed"][0]["name"] == "libssl3"


def test_the_rebuild_takes_the_registry_cache_only_as_publishs_trusted_keys_signed_it(
        clean) -> None:
    """The scheduled path builds with publish's trusted keys: the registry's build cache only
    when one of them signed it (builder.stages.signed_cache), none at all when unsigned."""
    key = keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))
    findings = [checking.Finding(variant_id=VID, reason="inputs-changed", status="rebuild",
                                 detail="x")]
    built = []
    for trust in (keypair.Trust(key=key, vouchers=keypair.Vouchers((key.public,))),
                  keypair.UNSIGNED):
        rebuild.rebuild(asked(findings=findings,
                              build=lambda m, v, options: built.append(options) or [],
                              trust=trust))
    assert [o.cache_vouchers.keys for o in built] == [(key.public,), ()]
    assert all(o.registry_cache and o.key is None for o in built)


def test_python_vuln_relocks_then_builds(clean) -> None:
    findings = [checking.Finding(variant_id=VID, reason="python-vuln", status="rebuild", detail="x", data={"name": "jinja2"})]
    upgraded = []
    clean.setattr(rebuild, "upgrade_packages",
                  lambda m, v, d, pkgs: upgraded.append(pkgs) or False)
    actions = rebuild.rebuild(asked(findings=findings,
                                    build=lambda *a: pytest.fail("lock unchanged: no build"),
                                    publish=lambda *a, **k: pytest.fail("no publish")))
    assert upgraded == [["jinja2"]]
    assert actions[0].state == "unchanged"


def test_dry_run_changes_nothing(clean) -> None:
    findings = [checking.Finding(variant_id=VID, reason="inputs-changed", status="rebuild", detail="x")]
    actions = rebuild.rebuild(asked(findings=findings, dry_run=True,
                                    build=lambda *a: pytest.fail("no build")))
    assert [a.state for a in actions] == ["would-rebuild"]


def test_failed_build_is_reported(clean) -> None:
    findings = [checking.Finding(variant_id=VID, reason="inputs-changed", status="rebuild", detail="x")]

    def build(*args):
        raise BuilderError("engine gone")

    actions = rebuild.rebuild(asked(findings=findings, build=build))
    assert actions[0].state == "failed" and "engine gone" in actions[0].message


def test_a_refused_publish_keeps_its_hint(clean) -> None:
    """A checkout behind the registry (builder.flows.tag_repair.refuse_older): the action
    fails with the refusal and keeps its hint, which the CLI prints (`hint:` on stderr)."""
    findings = [checking.Finding(variant_id=VID, reason="inputs-changed", status="rebuild", detail="x")]

    def build(*args):
        raise BuilderError("older than the newest signed publication", hint="update the checkout")

    actions = rebuild.rebuild(asked(findings=findings, build=build))
    assert (actions[0].state, actions[0].hint) == ("failed", "update the checkout")


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("findings", "code"), [
    ([], 0),
    ([checking.Finding(variant_id=VID, reason="base-moved", status="rebuild", detail="x")], 1),
    ([checking.Finding(variant_id=VID, reason="base-moved", status="rebuild", detail="x"),
      checking.Finding(variant_id=VID, reason="python-vuln", status="unknown", detail="offline")], 1),
    ([checking.Finding(variant_id=VID, reason="python-vuln", status="unknown", detail="offline")], 2),
])
def test_cli_check_exit_codes(clean, tmp_path: Path, capsys, findings, code) -> None:
    from builder.cli import main

    manifest = tmp_path / "published.json"
    manifest.write_text("{}")
    clean.setattr(rebuild_cmd, "_selected", lambda args: (None, [CPU]))
    clean.setattr(rebuild_cmd, "check", lambda *a, **k: findings)
    assert main(["rebuild", "--check", "--json", "--manifest", str(manifest)]) == code
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == code and len(out["findings"]) == len(findings)
    # the latest signed audit of each image (audit_check): none is read without a trusted key
    assert [(a["variant"], a["state"]) for a in out["audits"]] == [(VID, "no key")]


def test_cli_rebuild_nothing_to_do(clean, tmp_path: Path, capsys) -> None:
    from builder.cli import main

    manifest = tmp_path / "published.json"
    manifest.write_text("{}")
    clean.setattr(rebuild_cmd, "_selected", lambda args: (None, [CPU]))
    clean.setattr(rebuild_cmd, "check", lambda *a, **k: [])
    assert main(["rebuild", "--manifest", str(manifest)]) == 0
    assert "nothing rebuilt, nothing pushed" in capsys.readouterr().out




def test_apt_asks_in_an_unprivileged_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """The published image is not trusted: no host network, nobody's uid, read-only root."""
    calls = []

    def run_container(name, args, **kw):
        calls.append(args)
        return SimpleNamespace(returncode=0, stdout="Listing...\n", stderr="")

    monkeypatch.setattr(checking.engine, "run_container", run_container)
    assert checking.debian_upgradable("img") == {}
    [args] = calls
    line = " ".join(args)
    assert "--network host" not in line and "--network bridge" in line
    assert "--user 65534:65534" in line and "--read-only" in line
    assert "--cap-drop ALL" in line and "no-new-privileges" in line
    assert "Dir::State::Lists=/tmp/apt/lists" in line


def test_a_signed_publication_is_not_run_unverified() -> None:
    signed = publication(content_hash=HASH, signed=True)
    assert "give --trust-key" in checking.signature_problem(signed, keypair.NOBODY)
    assert checking.signature_problem(publication(content_hash=HASH), keypair.NOBODY) == ""


def test_an_image_whose_signature_fails_is_not_run(clean, monkeypatch) -> None:
    key = keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))

    def refuse(reg, repository, digest, keys):
        raise sign.SignatureError("no signature")

    monkeypatch.setattr(checking.vouch, "verify_image", refuse)
    monkeypatch.setattr(checking, "debian_upgradable", lambda image: pytest.fail("it ran"))
    findings = checking.check(None, [CPU],  # type: ignore[arg-type]
                              vouchers=keypair.Vouchers((key.public,)))
    [debian] = [f for f in findings if f.reason == "debian-security"]
    assert debian.status == checking.UNKNOWN and "not run: its signature" in debian.detail


def test_rebuild_check_with_nothing_published_calls_no_source_clean(capsys, monkeypatch):
    from builder.flows import record

    monkeypatch.setattr(record, "latest", lambda *_a: {})  # the registry records nothing
    args = cli.build_parser("rebuild").parse_args([
        "rebuild", "--check", "--json",
        "--matrix", str(ROOT / "matrix.yaml"), "--locks", str(LOCKS)])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "clean" not in doc["sources"].values()
    assert set(doc["sources"].values()) == {"not-asked"}
    assert doc["message"].startswith("nothing checked: the registry records no publication")
