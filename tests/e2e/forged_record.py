"""What tests/e2e/test_forged_record_e2e.py's cases share: the `builder` commands they run in
the module's registry (`env`, its module fixture), how they read the vetted repository, forge
tags in it as anyone with push rights could, sign publications as the pipeline would, and read
what `publish`, `verify` and `rebuild --check` said.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from fixtures_published import ALIAS, CPU, PASSWORD
from helpers import Saved, fake_image, real_labels, run_builder

from builder.core import clock, keypair, labels, sign
from builder.model import tags as tag_rules

SKIP = ("--skip-source", "python-vuln", "--skip-source", "debian-security")


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


def verified(env: dict[str, Any], *tags: str) -> None:
    """`verify --key` passes on each of `tags`."""
    for tag in tags:
        result = verify(env, tag)
        assert result.returncode == 0, (tag, result.stdout, result.stderr)


def signed_tags(env: dict[str, Any], digest: str) -> set[str]:
    """The tags the session's key signed for `digest`: what `verify --key` checks a tag against,
    without the checks of the digest itself (a test that verified the digest once by one tag
    checks its other tags so)."""
    return sign.tags_signed_by(env["reg"], env["repo"], digest,
                               [keypair.load_public(env["pub"])])
