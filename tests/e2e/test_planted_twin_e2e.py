"""Twins made, never found (issue 40.4), for real: a zstd twin anyone with push rights planted
before `publish` is replaced by the one publish recompresses (and reported), and `verify --key`
judges a twin by its layers' bytes, not by who signed it.

The session's CPU runtime (fixtures_published: built, staged with signed evidence by a key from
`builder keygen`) is published by the same key into a registry of this module's own, its staging
only read; nothing is built. Before that `publish --key`, two twins claiming to be its twin (their source annotation names its digest) are planted:
  - under `<floating>-zstd`: an image index of an older publication (a tiny image's twin);
  - under `build-<hash>-zstd`: a manifest with the same config and zstd layers of other bytes.
Publish replaces both with the twin it made (one line each). Then a twin with one layer swapped
is signed with the trusted key (as a publish that trusted a planted twin would have signed it):
`verify --key` fails it on that layer's diff id; the genuine `build-<hash>-zstd` passes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import zstandard
from fixtures_published import (
    CPU,
    PASSWORD,
    Publication,
    moved_matrix,
    own_registry,
)
from helpers import Saved, fake_image, run_builder

from builder.core import keypair, oci, sign, zstd
from builder.stages import twin

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A registry of this module's own, where the session's staged image (fixtures_published,
    only read) is published by the same key: the twins are planted there, never in the
    session's registry."""
    tmp = tmp_path_factory.mktemp("planted-twin")
    shared = shared_publication
    with own_registry(tmp) as addr:
        matrix = moved_matrix(shared, tmp, addr, staging=f"{shared.addr}/{shared.staging}")
        yield {"matrix": matrix, "addr": addr, "tmp": tmp, "env": shared.env,
               "key": shared.key, "pub": shared.pub, "reg": oci.Registry(addr),
               "repo": shared.repository, "shared": shared}


def verify(env: dict[str, Any], tag: str) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", f"{env['addr']}/{env['repo']}:{tag}", "--key",
                       str(env["pub"]), env=env["env"], check=False)


def zstd_blob(env: dict[str, Any], data: bytes) -> dict[str, Any]:
    """A tar+zstd layer of `data` pushed into the vetted repository; its descriptor."""
    blob = zstandard.ZstdCompressor().compress(data)
    return {"mediaType": zstd.MEDIA_TYPE, "size": len(blob),
            "digest": env["reg"].push_blob(env["repo"], blob)}


def put(env: dict[str, Any], doc: dict[str, Any]) -> str:
    body = json.dumps(doc).encode()
    return env["reg"].put_manifest(env["repo"], oci.sha256(body), body, doc["mediaType"])


def older_index(env: dict[str, Any], source: str) -> str:
    """An image index of an older publication's twin (a tiny image), annotated as `source`'s."""
    old = fake_image(env["reg"], env["repo"], {})
    _, desc = env["reg"].manifest(env["repo"], old)  # type: ignore[misc]
    return put(env, {"schemaVersion": 2, "mediaType": oci.OCI_INDEX,
                     "manifests": [{**desc.as_json(),
                                    "platform": {"os": "linux", "architecture": "amd64"}}],
                     "annotations": {twin.SOURCE_ANNOTATION: source}})


def same_config_other_layers(env: dict[str, Any], source: str) -> str:
    """A manifest with `source`'s config (copied from the session's staging) and as many zstd
    layers, of other bytes."""
    shared: Publication = env["shared"]
    staging = oci.Registry(shared.addr)
    gz = json.loads(staging.manifest(shared.staging, source)[0])  # type: ignore[index]
    config = gz["config"]
    env["reg"].push_blob(env["repo"], staging.blob(shared.staging, config["digest"]))
    layers = [zstd_blob(env, f"not layer {n}".encode()) for n in range(len(gz["layers"]))]
    return put(env, {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                     "config": {"mediaType": oci.OCI_CONFIG, "digest": config["digest"],
                                "size": config["size"]},
                     "layers": layers, "annotations": {twin.SOURCE_ANNOTATION: source}})


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, Any]:
    """Two twins of the staged image planted, then `publish --key` (nothing built)."""
    shared: Publication = env["shared"]
    staged = shared.staged
    planted = {twin.tag_of(CPU): older_index(env, staged),
               twin.tag_of(shared.record["hash_tag"]): same_config_other_layers(env, staged)}
    for tag, digest in planted.items():
        env["reg"].tag(env["repo"], digest, tag)
    result = run_builder("publish", "--select", f"id={CPU}", "--key", str(env["key"]),
                         "--manifest", str(env["tmp"] / "published.json"),
                         matrix=env["matrix"], env=env["env"], check=False)
    print(result.stdout, result.stderr, sep="\n")
    assert result.returncode == 0, result.stdout + result.stderr
    [pub] = json.loads((env["tmp"] / "published.json").read_text())["variants"][CPU][
        "publications"]
    return {**pub, "staged": staged, "planted": planted, "run": result}


def test_a_planted_twin_is_replaced_at_publish(env, published) -> None:
    log = published["run"].stdout + published["run"].stderr
    made = published["zstd"]["digest"]
    assert published["digest"] == published["staged"]
    for tag, digest in published["planted"].items():
        line = f"zstd twin `{tag}` held {digest[:19]}, not the twin made of " \
               f"{published['digest'][:19]}: replacing it"
        assert line in log, log
        print(line)
        head = env["reg"].head(env["repo"], tag)
        assert head is not None and head.digest == made
        assert head.digest != digest
    result = verify(env, twin.tag_of(CPU))
    assert result.returncode == 0, result.stdout + result.stderr


def test_verify_fails_a_signed_twin_whose_layer_is_not_its_diff_id(env, published) -> None:
    reg, repo, tag = env["reg"], env["repo"], twin.tag_of(CPU)
    doc = json.loads(reg.manifest(repo, published["zstd"]["digest"])[0])  # type: ignore[index]
    doc["layers"][0] = {**doc["layers"][0], **zstd_blob(env, b"a .pth file, say")}
    forged = put(env, doc)
    signing = keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())
    sign.sign_image(reg, repo, forged, signing, sign.tag_annotations(CPU, [tag]))
    saved = Saved(env["addr"])
    saved.keep(repo, tag)
    try:
        reg.tag(repo, forged, tag)
        result = verify(env, tag)
    finally:
        saved.restore()
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out
    assert "not the config's diff id" in out, out
    print(next(x for x in out.splitlines() if "diff id" in x))


def test_verify_passes_the_genuine_build_tag_twin(env, published) -> None:
    result = verify(env, twin.tag_of(published["hash_tag"]))
    assert result.returncode == 0, result.stdout + result.stderr
    print(next(x for x in result.stdout.splitlines() if "zstd twin" in x))
