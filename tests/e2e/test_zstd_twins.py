"""zstd twins, for real: the CPU runtime built and staged once (signed evidence): the session's
publication (fixtures_published), published with `builder publish --key` into registry A; the
same staged image published into an empty registry B with an empty twin cache (recompressed
from nothing), into D with the session's cache (every layer copied, none recompressed) and, with
`compression: [gzip]`, into a registry C. Every tag gets `<tag>-zstd` with only tar+zstd layers
and the gzip tag's config; `verify --key` passes on both; containerd (dockerd's own, through
`ctr`, a fresh namespace) pulls and runs the twin; the twin digest is the same in A, B and D;
[gzip] writes none.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fixtures_published import (
    CPU,
    Publication,
    moved_matrix,
    own_registry,
    republish,
)
from helpers import missing, run_builder

from builder.core import oci, zstd
from builder.stages import twin

pytestmark = pytest.mark.docker

SOCK = "/run/docker/containerd/containerd.sock"


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A: the session's publication (fixtures_published: staged once, published with twins);
    B and C: empty registries of this module's own, published into from A's staging, C with
    `compression: [gzip]`."""
    tmp = tmp_path_factory.mktemp("zstd")
    for name in ("b", "c"):
        (tmp / name).mkdir()
    with own_registry(tmp / "b") as addr_b, own_registry(tmp / "c") as addr_c:
        yield {"tmp": tmp, "shared": shared_publication, "repo": shared_publication.repository,
               "addrs": {"a": shared_publication.addr, "b": addr_b, "c": addr_c},
               "env": shared_publication.env, "pub": shared_publication.pub}


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A's publication; the same staged image published into B and (gzip only) into C."""
    shared: Publication = env["shared"]
    tmp, addrs = env["tmp"], env["addrs"]
    cold = replace(shared, env={**shared.env, "BUILDER_TWIN_CACHE": str(tmp / "b" / "cache")})
    return {"a": shared.record, "b": republish(cold, tmp / "b", addrs["b"]).record,
            "c": republish(shared, tmp / "c", addrs["c"], compression=["gzip"]).record}


def manifest(addr: str, repository: str, ref: str) -> dict[str, Any]:
    found = oci.Registry(addr).manifest(repository, ref)
    assert found is not None, ref
    return json.loads(found[0])


def test_every_tag_has_a_zstd_twin_with_the_same_config(env, published) -> None:
    pub, addr, repo = published["a"], env["addrs"]["a"], env["repo"]
    assert pub["zstd"]["tags"] == [twin.tag_of(t) for t in
                                   [pub["dated_tag"], pub["hash_tag"], *pub["tags"][2:]]]
    assert set(pub["zstd"]["tags"]) == {twin.tag_of(t) for t in pub["tags"]}
    gz = manifest(addr, repo, pub["digest"])
    for tag in pub["zstd"]["tags"]:
        assert oci.Registry(addr).head(repo, tag).digest == pub["zstd"]["digest"], tag
    zs = manifest(addr, repo, pub["zstd"]["digest"])
    assert {layer["mediaType"] for layer in zs["layers"]} == {zstd.MEDIA_TYPE}
    assert zs["config"]["digest"] == gz["config"]["digest"]
    assert len(zs["layers"]) == len(gz["layers"])
    assert zs["annotations"][twin.SOURCE_ANNOTATION] == pub["digest"]


def test_verify_key_passes_on_both(env, published) -> None:
    pub, addr, repo = published["a"], env["addrs"]["a"], env["repo"]
    for ref in (pub["reference"], pub["zstd"]["reference"],
                f"{addr}/{repo}:{twin.tag_of(pub['floating_tag'])}"):
        result = run_builder("verify", ref, "--key", str(env["pub"]), "--json", env=env["env"],
                             check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        checks = {c["what"]: c["status"] for c in json.loads(result.stdout)["checks"]}
        assert checks["signature"] == "ok" and checks["attestation provenance"] == "ok", checks
        assert checks.get("zstd twin", "ok" if ref == pub["reference"] else None) == "ok", checks


def test_the_twin_digest_is_the_same_in_two_empty_registries(published) -> None:
    assert published["a"]["digest"] == published["b"]["digest"]
    assert published["a"]["zstd"]["digest"] == published["b"]["zstd"]["digest"]


def test_a_warm_cache_copies_the_layers_and_gives_the_same_twin(env, published) -> None:
    """Registry D, with the session's twin cache (A's publication filled it): no layer is
    recompressed, each is copied from where it was pushed (checked against its digest), and
    the twin is the one B recompressed from nothing."""
    shared: Publication = env["shared"]
    folder = env["tmp"] / "d"
    folder.mkdir()
    with own_registry(folder) as addr:
        matrix = moved_matrix(shared, folder, addr, staging=f"{shared.addr}/{shared.staging}")
        result = run_builder("publish", "--select", f"id={CPU}", "--key", str(shared.key),
                             "--manifest", str(folder / "published.json"), matrix=matrix,
                             env=shared.env)
        [pub] = json.loads((folder / "published.json").read_text())["variants"][CPU][
            "publications"]
    assert pub["zstd"]["digest"] == published["b"]["zstd"]["digest"]
    assert ", recompressed in" not in result.stderr, result.stderr
    assert re.search(r"\((\d+) of \1 layers made before\)", result.stderr), result.stderr
    assert "copied from `" in result.stderr, result.stderr
    print(result.stderr)


def test_compression_gzip_writes_no_twin(env, published) -> None:
    assert "zstd" not in published["c"]
    tags = oci.Registry(env["addrs"]["c"]).tags(env["repo"])
    assert published["c"]["floating_tag"] in tags
    assert not [t for t in tags if t.endswith(twin.SUFFIX)], tags


def test_containerd_pulls_and_runs_the_twin(env, published, tmp_path) -> None:
    if shutil.which("ctr") is None or not Path(SOCK).exists():
        missing("no ctr or no dockerd containerd socket")
    ref = f"{env['addrs']['a']}/{env['repo']}:" \
          f"{twin.tag_of(published['a']['floating_tag'])}"
    ns = f"e2e-zstd-{uuid.uuid4().hex[:8]}"
    ctr = ["ctr", "--address", SOCK, "-n", ns]
    try:
        subprocess.run([*ctr, "images", "pull", "--plain-http", ref], check=True,
                       capture_output=True, text=True, timeout=1200)
        out = subprocess.run([*ctr, "run", "--rm", "--runc-root", str(tmp_path / "runc"), ref,
                              f"zstd-{uuid.uuid4().hex[:6]}", "python",
                              "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().startswith("2.13.0")
    finally:
        subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, check=False)
        subprocess.run([*ctr, "namespaces", "rm", ns], capture_output=True, check=False)
