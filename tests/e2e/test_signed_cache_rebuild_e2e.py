"""`builder rebuild` takes the registry's build cache only as signed (issue 40 item 1, "`rebuild`
likewise"): the scheduled path, which publishes, decides through the same function as `build`
(builder.stages.signed_cache.choose).

The session's CPU runtime (fixtures_published) is staged (its cache image pushed and signed by
the `builder keygen` key) into a staging repository of this module's own in the session's
registry (`own_staging`: the push mounts the session's layers) and published, without zstd
twins, into a registry of this module's own (`restage`: the build is the build cache's). A rebuild needs a reason that leaves the cached steps valid: a
moved base misses the cache for every step, so the lock gains a comment line (recorded in its
`.json` as `builder lock` would): the content hash moves (`inputs-changed`), the Dockerfile and
every mounted input do not. Then:
  - with the genuine signed cache, `rebuild --key` offers BuildKit the cache by its signed
    digest (its log imports the cache manifest from `…-staging@sha256:…`, CACHED steps) and
    publishes;
  - after someone with push rights to the staging repository replaced the cache image's last
    layer with one adding a `.pth` file (tests/e2e/cache_poison.py), `rebuild --key` says in one
    line that the cache was not used and why, never offers it, and the `.pth` file is not in the
    built image (its files listed).
The sources that need the network or a base (debian-security, python-vuln, base-moved) are
skipped: `inputs-changed` alone decides. The smoke test is not this module's proof: each rebuilt
image is built once first without one and given the session image's smoke report and SBOM
(fixtures_published.lend_evidence), which the rebuild reuses by image id. First, on the restaged publication, the daily
`rebuild --check` reports the audit `publish --key` attested (issue 41.7).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_poison import EVIL, build_log, cache_line, image_files, poison, shown
from fixtures_published import CPU, Publication, lend_evidence, own_registry, own_staging, restage
from helpers import run_builder

from builder.core import keypair, oci, sign
from builder.model import lockfile

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
SKIP = ("--skip-source", "debian-security", "--skip-source", "python-vuln",
        "--skip-source", "base-moved")


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The session's image staged (in a staging repository of this module's own) and published
    by the same key into this module's registry; rebuilds keep their own state folder (the
    shared one is only read)."""
    tmp = tmp_path_factory.mktemp("signed-cache-rebuild")
    with own_registry(tmp) as addr, own_staging(shared_publication, "cache-rebuild") as ref:
        # no zstd twins (each a recompression of the whole image): test_zstd_twins proves them
        pub = restage(shared_publication, tmp, addr, staging=ref, compression=["gzip"])
        staging_addr, staging = ref.split("/", 1)
        tag = "cache-" + pub.image.rsplit(":", 1)[1]
        yield {"pub": pub, "tmp": tmp, "reg": oci.Registry(staging_addr), "staging": staging,
               "staging_ref": ref, "cache": f"{ref}:{tag}", "tag": tag,
               "env": {**pub.env, "BUILDER_STATE": str(tmp / "state")}}


def relocked(env: dict[str, Any], comment: str) -> Path:
    """A copy of the checkout's locks whose CPU runtime lock ends with `# comment` (its sha256
    recorded in its `.json`): a new content hash, the same build steps."""
    folder = env["tmp"] / f"locks-{comment}"
    shutil.copytree(ROOT / "locks", folder)
    txt, meta_path = folder / f"{CPU}.txt", folder / f"{CPU}.json"
    text = txt.read_text() + f"# {comment}\n"
    txt.write_text(text)
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "text_sha256": lockfile.text_sha256(text)},
                                    indent=2) + "\n")
    return folder


def lent(env: dict[str, Any], locks: Path) -> None:
    """The image those locks build (`build --no-smoke --no-sbom`: the build cache's but its
    facts layer), given the session image's evidence (fixtures_published.lend_evidence): the
    rebuild gives that image id again and reuses them, as it would a smoke report of its own."""
    pub: Publication = env["pub"]
    [built] = json.loads(run_builder("build", "--select", f"id={CPU}", "--no-smoke", "--no-sbom",
                                     "--locks", str(locks), "--json", matrix=pub.matrix,
                                     env=env["env"]).stdout)
    lend_evidence(pub, env["tmp"] / "state", built["image"], built["image_id"])


def rebuild(env: dict[str, Any], comment: str) -> subprocess.CompletedProcess[str]:
    pub: Publication = env["pub"]
    locks = relocked(env, comment)
    lent(env, locks)
    return run_builder("rebuild", "--select", f"id={CPU}", *SKIP, "--key", str(pub.key),
                       "--locks", str(locks), "--json",
                       "--manifest", str(env["tmp"] / f"rebuilt-{comment}.json"),
                       matrix=pub.matrix, env=env["env"], check=False)


def published(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one action of `rebuild --json`, which must have published for inputs-changed."""
    assert result.returncode == 0, result.stderr[-4000:]
    [action] = json.loads(result.stdout)["actions"]
    assert action["reasons"] == ["inputs-changed"], action
    assert action["state"] == "published", action
    assert "reused the smoke report and SBOM" in result.stderr, result.stderr[-3000:]
    return action


def test_the_daily_check_reports_the_signed_audit_publish_attached(env) -> None:
    """Issue 41.7: `rebuild --check` (the daily job: a public key, no signing key) reports the
    latest publication's audit that `publish --key` attested by default."""
    pub: Publication = env["pub"]
    result = run_builder("rebuild", "--check", "--json", "--select", f"id={CPU}", *SKIP,
                         "--trust-key", str(pub.pub), matrix=pub.matrix, env=env["env"],
                         check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    [audit] = json.loads(result.stdout)["audits"]
    assert (audit["variant"], audit["state"]) == (CPU, "audited"), audit
    assert audit["reference"].endswith(pub.digest) and audit["audited_at"], audit
    assert audit["fixes"] == [] or all(f["fixed"] for f in audit["fixes"])


def test_rebuild_uses_a_genuine_signed_cache_by_its_digest(env) -> None:
    digest = env["reg"].head(env["staging"], env["tag"]).digest
    result = rebuild(env, "genuine")
    published(result)
    pinned = f"{env['staging_ref']}@{digest}"
    public = keypair.load_public(env["pub"].pub)
    assert cache_line(result).endswith(
        f"registry cache `{env['cache']}`: used as `{pinned}`, its signature verified against "
        f"the trusted key {keypair.key_id(public)}"), result.stderr[-3000:]
    log = build_log(result)
    shown(result, log)
    assert f"importing cache manifest from {pinned}" in log, log[-3000:]
    assert " CACHED" in log


def test_rebuild_never_offers_a_poisoned_cache_and_its_layer_is_not_in_the_image(env) -> None:
    poisoned = poison(env["reg"], env["staging"], env["tag"])
    result = rebuild(env, "poisoned")
    published(result)
    assert cache_line(result).endswith(
        f"registry cache `{env['cache']}`: not used: its signature did not verify: published "
        f"unsigned: no signature ({sign.sig_tag(poisoned)} is missing)"), result.stderr[-3000:]
    log = build_log(result)
    shown(result, log)
    assert "importing cache manifest" not in log  # BuildKit was never offered it
    files = image_files(env["pub"].image)
    assert "opt/venv/lib/python3.11/site-packages/torch" in files  # the listing is the image's
    assert EVIL not in files
    print(f"image files: {len(files)} paths, torch's site-packages among them, {EVIL} not")
