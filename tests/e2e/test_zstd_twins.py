"""zstd twins, for real: the CPU runtime built and staged once (signed evidence) on a staging
registry, then `builder publish --key` into two empty registries and, with `compression: [gzip]`,
into a third. Every tag gets `<tag>-zstd` with only tar+zstd layers and the gzip tag's config;
`verify --key` passes on both; containerd (dockerd's own, through `ctr`, a fresh namespace)
pulls and runs the twin; the twin digest is the same in both registries; [gzip] writes none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import amd64_matrix, free_port, missing, run_builder

from builder.core import engine, oci, registry, zstd
from builder.stages import twin

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
PASSWORD = "correct horse"
SOCK = "/run/docker/containerd/containerd.sock"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A staging registry and three empty ones (A, B: twins; C: compression [gzip]), a key."""
    tmp = tmp_path_factory.mktemp("zstd")
    addrs = {name: f"127.0.0.1:{free_port()}" for name in ("staging", "a", "b", "c")}
    for name, addr in addrs.items():
        registry.start(addr, tmp / f"registry-{name}")
    environ = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    environ.pop("COSIGN_PRIVATE_KEY", None)
    run_builder("keygen", "--out", str(tmp), env=environ)
    matrices = {}
    for name in ("a", "b", "c"):
        (tmp / name).mkdir()
        path = amd64_matrix(tmp / name, addrs[name])
        data = yaml.safe_load(path.read_text())
        data["staging"] = f"{addrs['staging']}/torch-staging"
        if name == "c":
            data["compression"] = ["gzip"]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        matrices[name] = path
    yield {"tmp": tmp, "addrs": addrs, "matrices": matrices, "env": environ,
           "key": tmp / "cosign.key", "pub": tmp / "cosign.pub"}
    for name in addrs:
        registry.stop(tmp / f"registry-{name}")
    for addr in addrs.values():
        refs = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}",
                             "--filter", f"reference={addr}/*").stdout.split()
        for ref in refs:
            engine.remove_image(ref)


def builder(env: dict[str, Any], name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrices"][name], env=env["env"])


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Staged once (from matrix A's build, staging shared), published into A, B and C."""
    builder(env, "a", "build", "--select", f"id={CPU}", "--stage", "--key", str(env["key"]))
    pubs = {}
    for name in ("a", "b", "c"):
        record = env["tmp"] / name / "published.json"
        builder(env, name, "publish", "--select", f"id={CPU}", "--key", str(env["key"]),
                "--manifest", str(record))
        [pubs[name]] = json.loads(record.read_text())["variants"][CPU]["publications"]
    return pubs


def manifest(addr: str, ref: str) -> dict[str, Any]:
    found = oci.Registry(addr).manifest("torch", ref)
    assert found is not None, ref
    return json.loads(found[0])


def test_every_tag_has_a_zstd_twin_with_the_same_config(env, published) -> None:
    pub, addr = published["a"], env["addrs"]["a"]
    assert pub["zstd"]["tags"] == [twin.tag_of(t) for t in
                                   [pub["dated_tag"], pub["hash_tag"], *pub["tags"][2:]]]
    assert set(pub["zstd"]["tags"]) == {twin.tag_of(t) for t in pub["tags"]}
    gz = manifest(addr, pub["digest"])
    for tag in pub["zstd"]["tags"]:
        assert oci.Registry(addr).head("torch", tag).digest == pub["zstd"]["digest"], tag
    zs = manifest(addr, pub["zstd"]["digest"])
    assert {layer["mediaType"] for layer in zs["layers"]} == {zstd.MEDIA_TYPE}
    assert zs["config"]["digest"] == gz["config"]["digest"]
    assert len(zs["layers"]) == len(gz["layers"])
    assert zs["annotations"][twin.SOURCE_ANNOTATION] == pub["digest"]


def test_verify_key_passes_on_both(env, published) -> None:
    pub, addr = published["a"], env["addrs"]["a"]
    for ref in (pub["reference"], pub["zstd"]["reference"],
                f"{addr}/torch:{twin.tag_of(pub['floating_tag'])}"):
        result = run_builder("verify", ref, "--key", str(env["pub"]), "--json", env=env["env"],
                             check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        checks = {c["what"]: c["status"] for c in json.loads(result.stdout)["checks"]}
        assert checks["signature"] == "ok" and checks["attestation provenance"] == "ok", checks
        assert checks.get("zstd twin", "ok" if ref == pub["reference"] else None) == "ok", checks


def test_the_twin_digest_is_the_same_in_two_empty_registries(published) -> None:
    assert published["a"]["digest"] == published["b"]["digest"]
    assert published["a"]["zstd"]["digest"] == published["b"]["zstd"]["digest"]


def test_compression_gzip_writes_no_twin(env, published) -> None:
    assert "zstd" not in published["c"]
    tags = oci.Registry(env["addrs"]["c"]).tags("torch")
    assert published["c"]["floating_tag"] in tags
    assert not [t for t in tags if t.endswith(twin.SUFFIX)], tags


def test_containerd_pulls_and_runs_the_twin(env, published) -> None:
    if shutil.which("ctr") is None or not Path(SOCK).exists():
        missing("no ctr or no dockerd containerd socket")
    ref = f"{env['addrs']['a']}/torch:{twin.tag_of(published['a']['floating_tag'])}"
    ns = f"e2e-zstd-{uuid.uuid4().hex[:8]}"
    ctr = ["ctr", "--address", SOCK, "-n", ns]
    try:
        subprocess.run([*ctr, "images", "pull", "--plain-http", ref], check=True,
                       capture_output=True, text=True, timeout=1200)
        out = subprocess.run([*ctr, "run", "--rm", ref, f"zstd-{uuid.uuid4().hex[:6]}", "python",
                              "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().startswith("2.13.0")
    finally:
        subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, check=False)
        subprocess.run([*ctr, "namespaces", "rm", ns], capture_output=True, check=False)
