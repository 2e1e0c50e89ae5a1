"""A signed base for fresh runners, for real: `builder build --stage --key` keeps today's
bootstrap signed and attested as `<repository>-base:bookworm-<key>`; a runner without the base
(its tags removed) takes it from the registry after verifying it, gets the same base digest and
content hash (the image stays up to date) and runs no mmdebstrap; with only another key trusted
it bootstraps, saying why.

The base image itself stays in the engine under a holding tag while its names are gone (other
tests on this engine may be building FROM it), and its names are back at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import base_removed, free_port, private_matrix, remove_images_of, run_builder

from builder.core import engine, keypair, oci, registry, sign
from builder.model.bases import bootstrap_ref
from builder.stages import base

pytestmark = pytest.mark.docker

CPU = ("--select", "id=2.13.0-py3.11-cpu-runtime", "--select", "platform=linux/amd64")
PASSWORD = "signed-base-e2e"
REF = bootstrap_ref("bookworm")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A private matrix on a fresh registry, two key pairs (ours, someone else's)."""
    tmp = tmp_path_factory.mktemp("signed-base")
    addr = f"127.0.0.1:{free_port()}"
    matrix_path = private_matrix(tmp, registry=addr)
    registry.start(addr, tmp / "registry")
    environ = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    environ.pop("COSIGN_PRIVATE_KEY", None)
    for who in ("ours", "other"):
        (tmp / who).mkdir()
        run_builder("keygen", "--out", str(tmp / who), env=environ)
    yield {"matrix": matrix_path, "addr": addr, "tmp": tmp, "env": environ,
           "repository": f"{matrix_data(matrix_path)['repository']}-base"}
    registry.stop(tmp / "registry")
    remove_images_of(matrix_path)


def matrix_data(matrix_path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(matrix_path.read_text())


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
    """The CPU runtime built and staged with our key: the base kept signed in the registry."""
    result = build(env, "--stage", "--key", str(env["tmp"] / "ours" / "cosign.key"))
    tag = f"bookworm-{base.bootstrap_key('bookworm', options=base.SLIM_OPTIONS)}"
    at = f"{env['addr']}/{env['repository']}:{tag}"
    assert f"base {REF}: pushed as `{at}`" in result.stderr, result.stderr[-3000:]
    return {"tag": tag, "plan": planned(env)}


def test_the_base_is_pushed_signed_and_attested(env, staged) -> None:
    reg = oci.Registry(env["addr"])
    found = reg.head(env["repository"], staged["tag"])
    assert found is not None
    ours = [keypair.load_public(env["tmp"] / "ours" / "cosign.pub")]
    [payload] = sign.verified_payloads(reg, env["repository"], found.digest, ours)
    assert staged["tag"] in sign.signed_tags(payload["optional"])
    attested, _ = sign.verified_attestations(reg, env["repository"], found.digest, ours)
    inputs = attested["provenance"]["predicate"]["buildDefinition"]["externalParameters"]
    assert inputs["suite"] == "bookworm" and inputs["packages"] == ["ca-certificates"]
    assert inputs["SOURCE_DATE_EPOCH"] and inputs["mmdebstrap"] and inputs["options"]


def test_a_runner_without_the_base_takes_it_verified_and_stays_up_to_date(
        env, staged, without_base) -> None:
    assert engine.inspect_image(REF) is None
    result = build(env, "--key", str(env["tmp"] / "ours" / "cosign.key"))
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
    result = build(env, "--trust-key", str(env["tmp"] / "other" / "cosign.pub"))
    lines = base_lines(result)
    assert lines[0] == (f"base {REF}: bootstrapping: the signature of `{env['addr']}/"
                        f"{env['repository']}:{staged['tag']}` did not verify: no valid "
                        "signature: a signature by another key"), result.stderr[-3000:]
    assert "with mmdebstrap" in lines[1]
    assert base.have_bootstrapped("bookworm")


def test_a_publishing_runner_without_the_base_finds_the_staged_image(
        env, staged, without_base) -> None:
    """The publish job of build.yml runs on a fresh runner: the staged image's content hash
    needs the base digest, which the signed base's provenance gives (no bootstrap, no tag
    taken on trust)."""
    assert engine.inspect_image(REF) is None
    result = run_builder("publish", *CPU, "--dry-run", "--json", "--key",
                         str(env["tmp"] / "ours" / "cosign.key"), "--allow-cpu-smoke",
                         matrix=env["matrix"], env=env["env"], check=False)
    [outcome] = json.loads(result.stdout)
    # Found by its content hash: then the gate reads its evidence (this one was staged with
    # --no-smoke --no-sbom, so it may be refused for that, never as not staged or stale).
    assert outcome["status"] in ("would-publish", "refused"), outcome
    reason = outcome.get("reason") or ""
    assert "not staged" not in reason and "stale image" not in reason, outcome
    assert engine.inspect_image(REF) is None  # nothing bootstrapped or loaded


def test_builder_base_takes_the_signed_base_too(env, staged, without_base) -> None:
    """`builder base` on a fresh runner: the same verified base, no mmdebstrap, same digest."""
    result = run_builder("base", *CPU, "--json", "--trust-key",
                         str(env["tmp"] / "ours" / "cosign.pub"),
                         matrix=env["matrix"], env=env["env"])
    [line] = base_lines(result)
    assert line.startswith(f"base {REF}: taken from `{env['addr']}/{env['repository']}:"
                           f"{staged['tag']}`"), result.stderr[-3000:]
    assert list(json.loads(result.stdout).values()) == [staged["plan"]["base_digest"]]
