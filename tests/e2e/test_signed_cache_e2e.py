"""The registry's build cache is an input like the base, for real (issue 40 item 1):
`build --stage --key` signs the cache image's pushed digest naming `cache-<tag>`; a later build
offers BuildKit that cache only by the signed digest (its log imports the cache manifest from
`…-staging@sha256:…` and shows CACHED steps); once someone with push rights to the staging
repository replaces a layer of the cache image (a layer adding a `.pth` file to site-packages,
its diff id in the config), the build says the cache was not used and why, BuildKit is never
offered it, and the `.pth` file is not in the built image (its files listed).

On the shared engine (never pruned): BuildKit's local cache may hold the same steps, so the
proof that the poisoned cache was never used is that BuildKit was never given it. The matrix is
a private repository in the session's registry, whose staging holds the session's publication
(fixtures_published, asked for first): `docker push` mounts those layers instead of compressing
them again.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cache_poison import EVIL, build_log, cache_line, image_files, poison
from fixtures_published import Publication
from helpers import cosign_env, private_matrix, remove_images_of, run_builder

from builder.core import keypair, oci, sign

pytestmark = pytest.mark.docker

VARIANT = "2.13.0-py3.11-cpu-runtime"
CPU = ("--select", f"id={VARIANT}", "--select", "platform=linux/amd64")
PASSWORD = "signed-cache-e2e"


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A private matrix in the session's registry, our key pair; the variant built and staged
    with our key (so its cache image is pushed and signed)."""
    import yaml

    tmp = tmp_path_factory.mktemp("signed-cache")
    addr = shared_publication.addr
    matrix_path = private_matrix(tmp, registry=addr)
    environ = cosign_env(PASSWORD)
    run_builder("keygen", "--out", str(tmp), env=environ)
    data = yaml.safe_load(matrix_path.read_text())
    env = {"matrix": matrix_path, "addr": addr, "env": environ, "key": str(tmp / "cosign.key"),
           "staging": f"{data['repository']}-staging",
           "public": keypair.load_public(tmp / "cosign.pub")}
    try:
        env["staged"] = build(env, "--stage", "--key", env["key"])
        yield env
    finally:
        remove_images_of(matrix_path)


def build(env: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return run_builder("build", *CPU, "--no-smoke", "--no-sbom", "--json", *args,
                       matrix=env["matrix"], env=env["env"])


def cache_tag(env: dict[str, Any]) -> str:
    [outcome] = json.loads(env["staged"].stdout)
    return "cache-" + outcome["image"].rsplit(":", 1)[1]


def test_staging_signs_the_cache_image_naming_its_tag(env) -> None:
    reg = oci.Registry(env["addr"])
    found = reg.head(env["staging"], cache_tag(env))
    assert found is not None, env["staged"].stderr[-3000:]
    assert sign.names_tag(reg, env["staging"], found.digest, cache_tag(env), [env["public"]])


def test_a_genuine_signed_cache_is_used_by_its_digest(env) -> None:
    digest = oci.Registry(env["addr"]).head(env["staging"], cache_tag(env)).digest
    result = build(env, "--force", "--key", env["key"])
    pinned = f"{env['addr']}/{env['staging']}@{digest}"
    assert cache_line(result).endswith(f"registry cache `{env['addr']}/{env['staging']}:"
                                       f"{cache_tag(env)}`: used as `{pinned}`, its signature "
                                       f"verified against the trusted key {keypair.key_id(env['public'])}")
    log = build_log(result)
    assert f"importing cache manifest from {pinned}" in log, log[-3000:]
    assert " CACHED" in log


def test_a_poisoned_cache_is_not_used_and_its_layer_is_not_in_the_image(env) -> None:
    reg = oci.Registry(env["addr"])
    poisoned = poison(reg, env["staging"], cache_tag(env))
    result = build(env, "--force", "--key", env["key"])
    assert cache_line(result).endswith(
        f"registry cache `{env['addr']}/{env['staging']}:{cache_tag(env)}`: not used: its "
        f"signature did not verify: published unsigned: no signature ({sign.sig_tag(poisoned)} "
        "is missing)"), result.stderr[-3000:]
    log = build_log(result)
    assert "importing cache manifest" not in log  # BuildKit was never offered it
    [outcome] = json.loads(result.stdout)
    assert outcome["state"] == "built"
    files = image_files(outcome["image"])
    assert "opt/venv/lib/python3.11/site-packages/torch" in files  # the listing is the image's
    assert EVIL not in files
