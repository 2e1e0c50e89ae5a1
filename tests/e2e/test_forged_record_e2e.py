"""Push rights are not trust, for real (issues 40.2, 40.3, 41.1): tags anyone may write never
become the record, and what they moved is put right.

The session's CPU runtime (fixtures_published: built and staged with signed evidence once) is
published once into a registry of this module's own with the session's `builder keygen` key,
under the session's matrix moved there, whose `trust_keys` is that key's public half and whose
staging stays the session's (only read: nothing is built or pushed again). Beside it
the test makes, with the same key, the signed publications a pipeline would have made (tiny
images wearing the real labels: an older one, and a newer one of other content), and forges
tags straight into the registry's HTTP API as anyone with push rights could:

  (c) 20 unsigned dated tags for today (and their `-zstd`): publish still publishes, dated today
  (a) a forged newer dated tag (and `-zstd`) on the older signed digest, the floating tag moved
      back to it: `verify --key` reports the rollback; `rebuild --check` and `publish` read the
      record as if the forged tag were absent
  (b) an unsigned `build-<hash>` for a hash never built: `plan` says `build`
  (d) a forged rollback of the floating tag, alias and twins: `publish` of the same content
      puts them back, and `verify --key` is ok again
  (e) content only an older signed publication holds: `publish` exits 1 with the
      update-the-checkout hint and moves nothing
  (f) a forged `<runtime>-99991231` on the slim's signed digest: `rebuild --check`, `publish`
      and the catalog read the runtime's record as if it were absent
  (g) the `.sig` of the publication and of its twin overwritten: `verify --key` fails; `publish`
      of the same content signs both again from their verified evidence, `verify --key` is ok
  and `rebuild --check` reports each tag moved off the newest signed publication as `tag-drift`
  (cases a and d), clean again once `publish` put it back
  and the catalog (`--key`) lists only signed publications as history, the rest as other tags

Each test puts back the tags it forged (tests/e2e/helpers.Saved).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_published import ALIAS, PASSWORD, Publication, moved_matrix, own_registry
from helpers import Saved, fake_image, real_labels, run_builder

from builder.core import clock, keypair, labels, oci, sign
from builder.model import tags as tag_rules

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
NEVER_BUILT = "2.13.0-py3.11-cpu-slim"
OLDER_DATE = "20200101"
FORGED_COUNT = 20
SKIP = ("--skip-source", "python-vuln", "--skip-source", "debian-security")


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A registry of the module's own; the session's matrix moved there, trusting the session's
    key, its staging the session's; a state folder of the module's own."""
    shared, tmp = shared_publication, tmp_path_factory.mktemp("forged-record")
    with own_registry(tmp) as addr:
        matrix = moved_matrix(shared, tmp, addr, staging=f"{shared.addr}/{shared.staging}",
                              trust_keys=[str(shared.pub)])
        yield {"matrix": matrix, "addr": addr, "tmp": tmp, "repo": shared.repository,
               "shared": shared, "key": shared.key, "pub": shared.pub,
               "env": {**shared.env, "BUILDER_STATE": str(tmp / "state")},
               "reg": oci.Registry(addr)}


def builder(env: dict[str, Any], *args: str, check: bool = False
            ) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], env=env["env"], check=check)


def publish(env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return builder(env, "publish", "--select", f"id={CPU}", "--key", str(env["key"]),
                   "--manifest", str(env["tmp"] / "published.json"))


def verify(env: dict[str, Any], tag: str) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", f"{env['addr']}/{env['repo']}:{tag}", "--key", str(env["pub"]),
                       env=env["env"], check=False)


def head(env: dict[str, Any], tag: str) -> str | None:
    desc = env["reg"].head(env["repo"], tag)
    return desc.digest if desc else None


def snapshot(env: dict[str, Any]) -> dict[str, str | None]:
    """Every tag of the vetted repository → its digest."""
    return {tag: head(env, tag) for tag in env["reg"].tags(env["repo"])}


def ours(env: dict[str, Any]) -> keypair.SigningKey:
    return keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())


def today(env: dict[str, Any]) -> str:
    """The day the builder's commands date their tags by (its clock, read as they read it)."""
    clock.reset()
    try:
        return clock.start(env["env"]).strftime("%Y%m%d")
    finally:
        clock.reset()


def twin(tag: str) -> str:
    return f"{tag}-zstd"


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, Any]:
    """Case (c)'s setting, then the module's one real publication: FORGED_COUNT unsigned dated
    tags for today (and twins) planted on an image wearing the session's staged image's labels,
    then `publish --key` of that staged image. Returns its publication and publish's run."""
    shared: Publication = env["shared"]
    reg = env["reg"]
    staged_labels = real_labels(oci.Registry(shared.addr), shared.staging, shared.staged)
    decoy = fake_image(reg, env["repo"], staged_labels)
    forged = [f"{CPU}-{today(env)}" + (f".{n}" if n else "") for n in range(FORGED_COUNT)]
    body, desc = reg.manifest(env["repo"], decoy)  # one small manifest, a PUT per tag
    for tag in forged:
        for name in (tag, twin(tag)):
            reg.put_manifest(env["repo"], name, body, desc.media_type)
    result = publish(env)
    print(result.stdout, result.stderr, sep="\n")  # each step's time (pytest -rP)
    [pub] = json.loads((env["tmp"] / "published.json").read_text())["variants"][CPU][
        "publications"]
    return {**pub, "run": result, "forged": forged, "decoy": decoy}


@pytest.fixture(scope="module")
def older(env: dict[str, Any], published: dict[str, Any]) -> dict[str, Any]:
    """An older publication of the variant, as the pipeline signed it then: other content
    (another content hash), its dated tag `<floating>-20200101`, the floating tag and alias."""
    return signed_publication(env, published, f"{CPU}-{OLDER_DATE}", "0" * 64)


def signed_publication(env: dict[str, Any], published: dict[str, Any], dated: str,
                       content_hash: str) -> dict[str, Any]:
    """A publication of the CPU runtime signed by the trusted key (a tiny image wearing the
    real labels but `content_hash`), tagged `dated` only."""
    reg = env["reg"]
    found = real_labels(reg, env["repo"], published["digest"]) | {labels.CONTENT_HASH: content_hash}
    digest = fake_image(reg, env["repo"], found)
    tags = [dated, tag_rules.HASH_TAG_PREFIX + content_hash[:20], CPU, ALIAS]
    sign.sign_image(reg, env["repo"], digest, ours(env), sign.tag_annotations(CPU, tags))
    reg.tag(env["repo"], digest, dated)
    return {"digest": digest, "dated_tag": dated, "content_hash": content_hash}


@pytest.fixture
def saved(env: dict[str, Any]) -> Iterator[Saved]:
    keep = Saved(env["addr"])
    yield keep
    keep.restore()


def forge(env: dict[str, Any], saved: Saved, digest: str, *tags: str) -> None:
    """Point `tags` at `digest`, as anyone with push rights may; put back after the test."""
    for tag in tags:
        saved.keep(env["repo"], tag)
        env["reg"].tag(env["repo"], digest, tag)


def rolled_back(result: subprocess.CompletedProcess[str], tag: str, newest: str) -> None:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(rf"`{re.escape(tag)}` is rolled back: .* older than the latest dated "
                     rf"publication `{re.escape(newest)}`", result.stdout), result.stdout


def already_published(result: subprocess.CompletedProcess[str], published: dict[str, Any]
                      ) -> list[str]:
    """publish found the real publication (the forged tags absent from its record): exit 0,
    `already published … (dated <the real dated tag>)`; returns the tags it said it moved."""
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert f"already published as {published['reference']} (dated {published['dated_tag']})" \
        in log, log
    return re.findall(r"moved `([^`]+)` from", log)


# ---- (c) many unsigned dated tags for today -----------------------------------------------------


def test_c_unsigned_dated_tags_for_today_take_no_suffix(env, published) -> None:
    result = published["run"]
    assert result.returncode == 0, result.stdout + result.stderr
    assert published["signed"] is True
    dated = f"{CPU}-{today(env)}"
    assert published["dated_tag"] == dated  # an unsigned tag is no publication: not a suffix
    assert head(env, dated) == published["digest"]
    assert head(env, twin(dated)) == published["zstd"]["digest"]
    assert head(env, CPU) == published["digest"]
    for tag in published["forged"][1:]:  # the others stay, and stay out of the record
        assert head(env, tag) == published["decoy"]
    assert f"{dated}.1: not part of the record" in result.stderr, result.stderr
    print(f"publish with {FORGED_COUNT} unsigned dated tags for today: exit 0, "
          f"published as `{published['dated_tag']}`")


# ---- (a) a forged newer dated tag on an older signed digest ---------------------------------


def test_a_forged_newer_dated_tag_on_an_older_signed_digest(env, published, older,
                                                            saved) -> None:
    forged = f"{published['dated_tag']}.1"
    forge(env, saved, older["digest"], forged, twin(forged), CPU, twin(CPU))

    rolled_back(verify(env, CPU), CPU, published["dated_tag"])
    rolled_back(verify(env, twin(CPU)), twin(CPU), twin(published["dated_tag"]))

    check = builder(env, "rebuild", "--check", "--json", "--select", f"id={CPU}", *SKIP)
    assert drifted(check) == {CPU, twin(CPU)}  # only that: the older content is not checked
    assert f"{forged}: not part of the record" in check.stderr, check.stderr

    before = {tag: head(env, tag) for tag in (forged, twin(forged))}
    moved = already_published(publish(env), published)
    assert set(moved) == {CPU, twin(CPU)}
    assert head(env, CPU) == published["digest"]
    assert head(env, twin(CPU)) == published["zstd"]["digest"]
    assert {tag: head(env, tag) for tag in (forged, twin(forged))} == before
    assert verify(env, CPU).returncode == 0


def drifted(check: subprocess.CompletedProcess[str]) -> set[str]:
    """The tags `rebuild --check --json` reports as `tag-drift` (exit 1; no other finding)."""
    findings = json.loads(check.stdout)["findings"]
    for f in findings:
        print(f"rebuild --check: {f['reason']} ({f['status']}): {f['detail']}")
    assert check.returncode == 1, check.stdout + check.stderr
    assert {(f["reason"], f["status"]) for f in findings} == {("tag-drift", "repair")}, findings
    return {f["data"]["tag"] for f in findings}


def clean_check(env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`rebuild --check` of the CPU runtime: exit 0, no finding."""
    check = builder(env, "rebuild", "--check", "--json", "--select", f"id={CPU}", *SKIP)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["findings"] == [], check.stdout
    return check


# ---- (b) an unsigned build tag for a hash never built ----------------------------------------


def plan_state(env: dict[str, Any], matrix: Path) -> tuple[str, str]:
    result = run_builder("plan", "--select", f"id={NEVER_BUILT}", "--json", matrix=matrix,
                         env=env["env"])
    [entry] = json.loads(result.stdout)["include"]
    return entry["state"], tag_rules.HASH_TAG_PREFIX + entry["content_hash"][:20]


def test_b_an_unsigned_build_tag_is_not_built(env, published, saved) -> None:
    state, hash_tag = plan_state(env, env["matrix"])
    assert state == "build"
    forge(env, saved, published["digest"], hash_tag)
    untrusting = env["tmp"] / "untrusting" / "matrix.yaml"  # the same, without trust_keys
    untrusting.parent.mkdir(exist_ok=True)
    data = yaml.safe_load(env["matrix"].read_text())
    del data["trust_keys"]
    untrusting.write_text(yaml.safe_dump(data, sort_keys=False))
    assert plan_state(env, untrusting)[0] == "up-to-date"  # the forged tag is there
    assert plan_state(env, env["matrix"])[0] == "build"


# ---- (d) a forged rollback, repaired by publish ---------------------------------------------


def test_d_publish_repairs_a_forged_rollback(env, published, older, saved) -> None:
    moving = (CPU, ALIAS, twin(CPU), twin(ALIAS))
    forge(env, saved, older["digest"], *moving)
    rolled_back(verify(env, ALIAS), ALIAS, published["dated_tag"])
    check = builder(env, "rebuild", "--check", "--json", "--select", f"id={CPU}", *SKIP)
    assert drifted(check) == set(moving)

    moved = already_published(publish(env), published)
    assert sorted(moved) == sorted(moving)
    clean_check(env)
    for tag in (CPU, ALIAS):
        assert head(env, tag) == published["digest"]
        assert head(env, twin(tag)) == published["zstd"]["digest"]
    for tag in moving:
        result = verify(env, tag)
        assert result.returncode == 0, (tag, result.stdout, result.stderr)


# ---- (e) content only an older signed publication holds -------------------------------------


def test_e_a_checkout_behind_the_registry_moves_nothing(env, published, saved) -> None:
    newer = f"{published['dated_tag']}.1"
    saved.keep(env["repo"], newer)
    pub = signed_publication(env, published, newer, "f" * 64)
    forge(env, saved, pub["digest"], CPU, ALIAS)  # as its publish moved them
    before = snapshot(env)

    result = publish(env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    error = next(x for x in result.stderr.splitlines() if x.startswith("error: "))
    assert f"builds the publication `{published['dated_tag']}`, older than the newest signed " \
           f"publication `{newer}`" in error, error
    assert "update the checkout" in result.stderr, result.stderr
    print(error)
    assert snapshot(env) == before


# ---- (f) a forged dated tag on another variant's signed digest -----------------------------


def test_f_a_forged_dated_tag_on_the_slims_signed_digest(env, published, saved) -> None:
    """The slim's signed digest is a tiny image wearing the runtime's labels but the slim's
    variant and flavor, signed by the trusted key for the slim as its publish would sign it:
    building a second torch variant would take minutes and prove nothing more, since the record
    reads only the labels and the signature (both the slim's here)."""
    reg = env["reg"]
    found = real_labels(reg, env["repo"], published["digest"])
    slim = fake_image(reg, env["repo"], found | {labels.VARIANT: NEVER_BUILT,
                                             labels.FLAVOR: "slim"})
    sign.sign_image(reg, env["repo"], slim, ours(env), sign.tag_annotations(
        NEVER_BUILT, [f"{NEVER_BUILT}-{today(env)}", NEVER_BUILT]))
    forged = f"{CPU}-99991231"
    forge(env, saved, slim, forged, twin(forged))

    check = clean_check(env)
    assert f"checking {published['reference']}" in check.stderr, check.stderr
    assert "records no publication" not in check.stdout + check.stderr
    assert already_published(publish(env), published) == []
    site = env["tmp"] / "site-f"
    run_builder("catalog", f"{env['addr']}/{env['repo']}", "--out", str(site), "--key", str(env["pub"]),
                env=env["env"])
    doc = json.loads((site / "catalog.json").read_text())
    [entry] = [v for v in doc["variants"] if v["tag"] == CPU]
    assert entry["digest"] == published["digest"], entry
    assert forged not in [h["tag"] for h in entry["history"]]
    print(f"forged `{forged}` on the slim's {slim[:19]}: rebuild --check exit 0 (checks "
          f"{published['digest'][:19]}), publish: already published (dated "
          f"{published['dated_tag']}), catalog history {[h['tag'] for h in entry['history']]}")


# ---- (g) an overwritten `.sig`, signed again by publish ---------------------------------------


def test_g_publish_signs_again_an_overwritten_sig(env, published, saved) -> None:
    reg, made = env["reg"], published["zstd"]["digest"]
    junk = [sign.Layer(sign.SIMPLE_SIGNING, b"{}", {sign.SIGNATURE_ANNOTATION: "AAAA"})]
    for digest in (published["digest"], made):
        saved.keep(env["repo"], sign.sig_tag(digest))
        sign.write_layers(reg, env["repo"], sign.sig_tag(digest), junk)
    before = verify(env, CPU)
    assert before.returncode == 1, before.stdout
    print("before:", next(x for x in before.stdout.splitlines() if "signature" in x))

    result = publish(env)
    log = result.stdout + result.stderr
    line = f"signed {published['digest'][:19]} again as `{published['dated_tag']}`"
    assert line in log, log
    print(next(x for x in log.splitlines() if line in x))
    assert already_published(result, published) == []
    for tag in (CPU, twin(CPU), published["dated_tag"], twin(published["dated_tag"])):
        after = verify(env, tag)
        assert after.returncode == 0, (tag, after.stdout, after.stderr)


# ---- the catalog's history: signed publications only (issue 40.2's done-when) -----------------


def test_the_catalog_lists_only_signed_publications_as_history(env, published, older) -> None:
    site = env["tmp"] / "site"
    run_builder("catalog", f"{env['addr']}/{env['repo']}", "--out", str(site), "--key", str(env["pub"]),
                env=env["env"])
    doc = json.loads((site / "catalog.json").read_text())
    [entry] = [v for v in doc["variants"] if v["tag"] == CPU]
    history = [h["tag"] for h in entry["history"]]
    print(f"catalog history of `{CPU}`: {history}")
    assert history == [older["dated_tag"], published["dated_tag"]]
    others = {t["tag"] for t in doc.get("other_tags", [])}
    assert set(published["forged"][1:]) <= others, others
