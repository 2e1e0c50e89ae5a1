"""A signed base for fresh runners, for real: `builder build --stage --key` keeps today's
bootstrap signed and attested as `<repository>-base:bookworm-<key>`; a runner without the base
(its tags removed) takes it from the registry after verifying it, gets the same base digest and
content hash (the image stays up to date) and runs no mmdebstrap; with only another key trusted
it bootstraps, saying why.

The staged build is the session's (fixtures_published: `build --stage --key` of the CPU
runtime); this module only reads its registry (no command here stages or publishes) and builds
with a state folder of its own and a second key pair (someone else's).

The base image itself stays in the engine under a holding tag while its names are gone (other
tests on this engine may be building FROM it), and its names are back at the end.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures_published import Publication
from helpers import base_removed, run_builder

from builder.core import engine, keypair, oci, sign
from builder.model.bases import bootstrap_ref
from builder.stages import base

pytestmark = pytest.mark.docker

CPU = ("--select", "id=2.13.0-py3.11-cpu-runtime", "--select", "platform=linux/amd64")
REF = bootstrap_ref("bookworm")


@pytest.fixture(scope="module")
def env(shared_publication: Publication, tmp_path_factory: pytest.TempPathFactory
        ) -> dict[str, Any]:
    """The session's matrix and key (ours), someone else's key pair, a state folder of its own."""
    tmp = tmp_path_factory.mktemp("signed-base")
    shared = shared_publication
    environ = {**shared.env, "BUILDER_STATE": str(tmp / "state")}
    run_builder("keygen", "--out", str(tmp), env=environ)
    return {"matrix": shared.matrix, "addr": shared.addr, "env": environ,
            "key": shared.key, "pub": shared.pub, "other": tmp / "cosign.pub",
            "repository": f"{shared.repository}-base", "digest": shared.digest}


def build(env: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return run_builder("build", *CPU, "--no-smoke", "--no-sbom", "--json", *args,
                       matrix=env["matrix"], env=env["env"])


def planned(env: dict[str, Any]) -> dict[str, Any]:
    out = run_builder("plan", *CPU, "--json", matrix=env["matrix"], env=env["env"]).stdout
    return json.loads(out)["include"][0]


def base_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines()
            if line.startswith(f"base {REF}:") or "with mmdebstrap" in line]


@pytest.fixture
def without_base() -> Iterator[None]:
    """The base's names removed (a fresh runner's engine) for the test (helpers.base_removed)."""
    with base_removed():
        yield


@pytest.fixture(scope="module")
def staged(env: dict[str, Any]) -> dict[str, Any]:
    """Where the session's `build --stage --key` kept the base, and the plan of its image."""
    tag = f"bookworm-{base.bootstrap_key('bookworm', options=base.SLIM_OPTIONS)}"
    return {"tag": tag, "plan": planned(env)}


def test_the_base_is_pushed_signed_and_attested(env, staged) -> None:
    reg = oci.Registry(env["addr"])
    found = reg.head(env["repository"], staged["tag"])
    assert found is not None
    ours = [keypair.load_public(env["pub"])]
    [payload] = sign.verified_payloads(reg, env["repository"], found.digest, ours)
    assert staged["tag"] in sign.signed_tags(payload["optional"])
    attested, _ = sign.verified_attestations(reg, env["repository"], found.digest, ours)
    inputs = attested["provenance"]["predicate"]["buildDefinition"]["externalParameters"]
    assert inputs["suite"] == "bookworm" and inputs["packages"] == ["ca-certificates"]
    assert inputs["SOURCE_DATE_EPOCH"] and inputs["mmdebstrap"] and inputs["options"]


def test_a_runner_without_the_base_takes_it_verified_and_stays_up_to_date(
        env, staged, without_base) -> None:
    assert engine.inspect_image(REF) is None
    result = build(env, "--key", str(env["key"]))
    [line] = base_lines(result)  # no "bootstrapping … with mmdebstrap"
    assert line.startswith(f"base {REF}: taken from `{env['addr']}/{env['repository']}:"
                           f"{staged['tag']}`"), result.stderr[-3000:]
    [outcome] = json.loads(result.stdout)
    assert outcome["state"] == "up-to-date"  # same content hash: nothing rebuilt
    again = planned(env)
    assert (again["base_digest"], again["content_hash"]) == (
        staged["plan"]["base_digest"], staged["plan"]["content_hash"])


def test_a_base_signed_by_another_key_is_bootstrapped_saying_why(
        env, staged, without_base) -> None:
    result = build(env, "--trust-key", str(env["other"]))
    lines = base_lines(result)
    assert lines[0] == (f"base {REF}: bootstrapping: the signature of `{env['addr']}/"
                        f"{env['repository']}:{staged['tag']}` did not verify: no valid "
                        "signature: a signature by another key"), result.stderr[-3000:]
    assert "with mmdebstrap" in lines[1]
    assert base.have_bootstrapped("bookworm")


def test_a_publishing_runner_without_the_base_finds_the_image_by_its_content_hash(
        env, staged, without_base) -> None:
    """The publish job of build.yml runs on a fresh runner: the staged image's content hash
    needs the base digest, which the signed base's provenance gives (no bootstrap, no tag
    taken on trust). The session's image is published already: publish finds that publication
    by the content hash it computed (a wrong one would say not staged or stale)."""
    assert engine.inspect_image(REF) is None
    result = run_builder("publish", *CPU, "--dry-run", "--json", "--key",
                         str(env["key"]), matrix=env["matrix"], env=env["env"], check=False)
    [outcome] = json.loads(result.stdout)
    assert outcome["status"] == "already-published", outcome
    assert outcome["digest"] == env["digest"], outcome
    assert engine.inspect_image(REF) is None  # nothing bootstrapped or loaded


def test_builder_base_takes_the_signed_base_too(env, staged, without_base) -> None:
    """`builder base` on a fresh runner: the same verified base, no mmdebstrap, same digest."""
    result = run_builder("base", *CPU, "--json", "--trust-key", str(env["pub"]),
                         matrix=env["matrix"], env=env["env"])
    [line] = base_lines(result)
    assert line.startswith(f"base {REF}: taken from `{env['addr']}/{env['repository']}:"
                           f"{staged['tag']}`"), result.stderr[-3000:]
    assert list(json.loads(result.stdout).values()) == [staged["plan"]["base_digest"]]
