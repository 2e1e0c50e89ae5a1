"""Push rights are not trust, for real (issues 40.2, 40.3, 41.1): tags anyone may write never
become the record, and what they moved is put right.

The session's CPU runtime (fixtures_published: built and staged with signed evidence once) is
published once into a registry of this module's own with the session's `builder keygen` key,
under the session's matrix moved there, whose `trust_keys` is that key's public half and whose
staging stays the session's (only read: the runtime is not built or pushed again). Beside it
the test makes, with the same key, the signed publications a pipeline would have made (tiny
images wearing the real labels: an older one, and a newer one of other content), and forges
tags straight into the registry's HTTP API as anyone with push rights could:

  (c) 97 unsigned dated tags for today (and their `-zstd`): publish still publishes, dated today
  (a) a forged newer dated tag (and `-zstd`) on the older signed digest, the floating tag moved
      back to it: `verify --key` reports the rollback; `rebuild --check` and `publish` read the
      record as if the forged tag were absent
  (b) an unsigned `build-<hash>` for a hash never built: `plan` says `build`
  (d) a forged rollback of the floating tag, alias and twins: `publish` of the same content
      puts them back, and `verify --key` is ok again
  (e) content only an older signed publication holds: `publish` exits 1 with the
      update-the-checkout hint and moves nothing
  (f) a forged `<runtime>-99991231` and `<runtime>-<today>.1` (and their `-zstd`) on the
      signed digest of the CPU slim, really
      built (from the build cache), staged and published beside the runtime: `plan` of both
      variants is unchanged (the slim up to date by its own signed `build-<hash>`), `publish` of
      the slim says already published under the slim's own dated tag and moves nothing,
      `rebuild --check` checks the runtime's publication, the catalog lists the forged tag under
      other tags
  (g) the `.sig` of the publication and of its twin overwritten: `verify --key` fails,
      `rebuild --check` reports the lost signature (`tag-drift`); `publish` of the same content
      re-attaches both from their signed copies, `verify --key` is ok
  (h) a newer dated tag planted on the publication's digest and its `.sig` wiped: `publish`
      re-attaches the signature naming the genuine dated tag, never the planted one
  and `rebuild --check` reports each tag moved off the newest signed publication as `tag-drift`
  (cases a and d), clean again once `publish` put it back
  and the catalog (`--key`) lists only signed publications as history, the rest as other tags

Each test puts back the tags it forged (tests/e2e/helpers.Saved); the helpers the cases share
are in tests/e2e/forged_record.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_published import (
    ALIAS,
    CPU,
    SLIM,
    Publication,
    moved_matrix,
    own_registry,
    publish_slim,
)
from forged_record import (
    SKIP,
    already_published,
    builder,
    clean_check,
    drifted,
    forge,
    head,
    publish,
    rolled_back,
    signed_publication,
    signed_tags,
    snapshot,
    today,
    twin,
    verified,
    verify,
)
from helpers import Saved, fake_image, real_labels, run_builder

from builder.core import oci, sign
from builder.model import tags as tag_rules

pytestmark = pytest.mark.docker

OLDER_DATE = "20200101"
FORGED_COUNT = 97  # the count: 99 suffixes taken today, once


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


@pytest.fixture
def saved(env: dict[str, Any]) -> Iterator[Saved]:
    keep = Saved(env["addr"])
    yield keep
    keep.restore()


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


# ---- (b) an unsigned build tag for a hash never built ----------------------------------------


def plan_state(env: dict[str, Any], matrix: Path) -> tuple[str, str]:
    result = run_builder("plan", "--select", f"id={SLIM}", "--json", matrix=matrix,
                         env=env["env"])
    [entry] = json.loads(result.stdout)["include"]
    return entry["state"], tag_rules.HASH_TAG_PREFIX + entry["content_hash"][:20]


def test_b_an_unsigned_build_tag_is_not_built(env, published, saved) -> None:
    """The slim is not built yet (case f publishes it, later)."""
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
    verified(env, ALIAS, twin(ALIAS))  # the floating tag and its twin: the same two digests
    assert {CPU, ALIAS} <= signed_tags(env, published["digest"])
    assert {twin(CPU), twin(ALIAS)} <= signed_tags(env, published["zstd"]["digest"])


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


@pytest.fixture(scope="module")
def slim(env: dict[str, Any], published: dict[str, Any]) -> dict[str, Any]:
    """The CPU slim, really built, staged and published beside the runtime by the same key
    (fixtures_published.publish_slim): its publication, and its matrix (staging its own)."""
    matrix, pub = publish_slim(env["shared"], env["tmp"] / "slim", env["addr"], env["env"],
                               trust_keys=[str(env["pub"])])
    return {**pub, "matrix": matrix}


def planned(env: dict[str, Any], matrix: Path, vid: str) -> dict[str, Any]:
    """`plan --json`'s entry for `vid`."""
    result = run_builder("plan", "--select", f"id={vid}", "--json", matrix=matrix,
                         env=env["env"])
    [entry] = json.loads(result.stdout)["include"]
    print(f"plan {vid}: {entry['state']} ({entry['where']}), {entry['content_hash'][:12]}")
    return entry


def test_f_a_forged_runtime_dated_tag_on_the_slims_signed_digest(env, published, slim,
                                                                  saved) -> None:
    matrix = slim["matrix"]
    plans = {vid: planned(env, matrix, vid) for vid in (SLIM, CPU)}
    forged = forge_on_slim(env, saved, slim)

    assert {vid: planned(env, matrix, vid) for vid in plans} == plans  # as if it were absent
    assert (plans[SLIM]["state"], plans[SLIM]["where"]) == ("up-to-date", "registry")
    hash_tag = tag_rules.HASH_TAG_PREFIX + plans[SLIM]["content_hash"][:20]
    assert hash_tag in slim["tags"] and head(env, hash_tag) == slim["digest"]  # its own record
    before = snapshot(env)
    result = run_builder("publish", "--select", f"id={SLIM}", "--key", str(env["key"]),
                         matrix=matrix, env=env["env"], check=False)
    assert already_published(result, slim) == [] and snapshot(env) == before
    assert not [x for x in result.stderr.splitlines() if "already" in x
                and any(tag in x for tag in forged)]
    check = clean_check(env)
    assert f"checking {published['reference']}" in check.stderr, check.stderr
    print(f"forged {forged} on the slim's {slim['digest'][:19]}: plan and publish of the "
          f"slim read its own `{slim['dated_tag']}`, rebuild --check the runtime's")


def forge_on_slim(env: dict[str, Any], saved: Saved, slim: dict[str, Any]) -> tuple[str, ...]:
    """Case (f)'s forgeries on the slim's signed digest (their `-zstd` on the slim's twin): the
    issue's runtime `-99991231`, which the date rule already drops, and a runtime `-<today>.1`,
    newer than every genuine tag of today, which only the signature rule (the slim's signature
    names none of the runtime's tags) keeps out of the record; returns both tags."""
    forged = (f"{CPU}-99991231", f"{CPU}-{today(env)}.1")
    forge(env, saved, slim["digest"], *forged)
    forge(env, saved, slim["zstd"]["digest"], *map(twin, forged))
    return forged


# ---- (g) an overwritten `.sig`, signed again by publish ---------------------------------------


def test_g_publish_puts_back_an_overwritten_sig(env, published, older, saved) -> None:
    """`older` is the newest signed publication while the `.sig` is lost (what the record and
    `rebuild --check` fall back on)."""
    reg, made = env["reg"], published["zstd"]["digest"]
    junk = [sign.Layer(sign.SIMPLE_SIGNING, b"{}", {sign.SIGNATURE_ANNOTATION: "AAAA"})]
    for digest in (published["digest"], made):
        saved.keep(env["repo"], sign.sig_tag(digest))
        sign.write_layers(reg, env["repo"], sign.sig_tag(digest), junk)
    before = verify(env, CPU)
    assert before.returncode == 1, before.stdout
    print("before:", next(x for x in before.stdout.splitlines() if "signature" in x))
    lost_signature(env, published["digest"], published["dated_tag"])

    result = publish(env)
    log = result.stdout + result.stderr
    line = f"re-attached the signature of {published['digest'][:19]} as " \
           f"`{published['dated_tag']}` from its signed copy"
    assert line in log, log
    assert f"re-attached the signature of {made[:19]} as " \
           f"`{twin(published['dated_tag'])}`" in log, log
    print(next(x for x in log.splitlines() if line in x))
    assert already_published(result, published) == []
    verified(env, CPU, twin(published["dated_tag"]))  # each re-attached `.sig`, in full
    assert {CPU, published["dated_tag"]} <= signed_tags(env, published["digest"])
    assert {twin(CPU), twin(published["dated_tag"])} <= signed_tags(env, made)


def lost_signature(env: dict[str, Any], digest: str, dated: str) -> None:
    """`rebuild --check` reports the lost `.sig` of `digest` as a `tag-drift` to repair, naming
    `dated` (its signed copy's dated tag)."""
    check = builder(env, "rebuild", "--check", "--json", "--select", f"id={CPU}", *SKIP)
    findings = json.loads(check.stdout)["findings"]
    [lost] = [f for f in findings if f["data"].get("tag") == sign.sig_tag(digest)]
    print(f"rebuild --check: {lost['reason']} ({lost['status']}): {lost['detail']}")
    assert check.returncode == 1 and (lost["reason"], lost["status"]) == ("tag-drift", "repair")
    assert lost["detail"].startswith(f"`{dated}` ({digest[:19]}) lost its signature"), lost


# ---- (h) a planted dated tag on a digest whose `.sig` was wiped -------------------------------


def test_h_a_planted_dated_tag_is_never_signed_when_the_sig_is_put_back(env, published, older,
                                                                         saved) -> None:
    reg, digest, dated = env["reg"], published["digest"], published["dated_tag"]
    planted = f"{dated}.1"  # newer than the genuine dated tag, on the same digest
    forge(env, saved, digest, planted)
    saved.keep(env["repo"], sign.sig_tag(digest))
    sign.write_layers(reg, env["repo"], sign.sig_tag(digest), [])  # wiped: no signature at all
    lost_signature(env, digest, dated)

    result = publish(env)
    log = result.stdout + result.stderr
    assert f"re-attached the signature of {digest[:19]} as `{dated}` from its signed copy" \
        in log, log
    refused = f"`{planted}` ({digest[:19]}): the signed copy of its digest's signature does " \
              "not name it: not signed"
    assert refused in log, log
    print(next(x for x in log.splitlines() if refused in x))
    assert already_published(result, published) == []
    signed = signed_tags(env, digest)
    assert dated in signed and planted not in signed, signed
    assert verify(env, CPU).returncode == 0
    forged = verify(env, planted)
    assert forged.returncode == 1, forged.stdout
    print(f"verify {planted}: exit 1", forged.stdout[-600:], sep="\n")
    clean_check(env)


# ---- the catalog's history: signed publications only (issue 40.2's done-when) -----------------


def test_the_catalog_lists_only_signed_publications_as_history(env, published, older, slim,
                                                                saved) -> None:
    """After the cases above (their forged tags left in place), case (f)'s forgery too."""
    forged = forge_on_slim(env, saved, slim)
    site = env["tmp"] / "site"
    run_builder("catalog", f"{env['addr']}/{env['repo']}", "--out", str(site), "--key", str(env["pub"]),
                env=env["env"])
    doc = json.loads((site / "catalog.json").read_text())
    history = {v["tag"]: [h["tag"] for h in v["history"]] for v in doc["variants"]}
    print(f"catalog history: {history}")
    assert history[CPU] == [older["dated_tag"], published["dated_tag"]]
    assert history[SLIM] == [slim["dated_tag"]], history
    others = {t["tag"] for t in doc.get("other_tags", [])}
    assert {*published["forged"][1:], *forged} <= others, others
