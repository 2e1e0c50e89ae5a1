"""Twins made, never found (issue 40.4), for real: a zstd twin anyone with push rights planted
before `publish` is replaced by the one publish recompresses (and reported), and `verify --key`
judges a twin by its layers' bytes, not by who signed it.

One CPU runtime image is built and staged with signed evidence (a key from `builder keygen`, a
matrix trusting its public half, a registry of this module's own). Before `publish --key`, two
twins claiming to be its twin (their source annotation names its digest) are planted:
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
from helpers import (
    Saved,
    fake_image,
    real_labels,
    run_builder,
    trusting_registry,
)

from builder.core import keypair, labels, oci, sign, zstd
from builder.model import tags as tag_rules
from builder.stages import twin

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
ALIAS = "latest-cpu-runtime"
PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A fresh registry, a key pair, a matrix trusting that key (helpers.trusting_registry)."""
    with trusting_registry(tmp_path_factory.mktemp("planted-twin"), ALIAS, PASSWORD) as found:
        yield found


def verify(env: dict[str, Any], tag: str) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", f"{env['addr']}/torch:{tag}", "--key", str(env["pub"]),
                       env=env["env"], check=False)


def zstd_blob(reg: oci.Registry, data: bytes) -> dict[str, Any]:
    """A tar+zstd layer of `data` pushed into the vetted repository; its descriptor."""
    blob = zstandard.ZstdCompressor().compress(data)
    return {"mediaType": zstd.MEDIA_TYPE, "size": len(blob), "digest": reg.push_blob("torch", blob)}


def put(reg: oci.Registry, doc: dict[str, Any]) -> str:
    body = json.dumps(doc).encode()
    return reg.put_manifest("torch", oci.sha256(body), body, doc["mediaType"])


def older_index(reg: oci.Registry, source: str) -> str:
    """An image index of an older publication's twin (a tiny image), annotated as `source`'s."""
    old = fake_image(reg, "torch", {})
    _, desc = reg.manifest("torch", old)  # type: ignore[misc]
    return put(reg, {"schemaVersion": 2, "mediaType": oci.OCI_INDEX,
                     "manifests": [{**desc.as_json(),
                                    "platform": {"os": "linux", "architecture": "amd64"}}],
                     "annotations": {twin.SOURCE_ANNOTATION: source}})


def same_config_other_layers(reg: oci.Registry, source: str) -> str:
    """A manifest with `source`'s config and as many zstd layers, of other bytes."""
    gz = json.loads(reg.manifest("torch-staging", source)[0])  # type: ignore[index]
    config = gz["config"]
    reg.push_blob("torch", reg.blob("torch-staging", config["digest"]))
    layers = [zstd_blob(reg, f"not layer {n}".encode()) for n in range(len(gz["layers"]))]
    return put(reg, {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                     "config": {"mediaType": oci.OCI_CONFIG, "digest": config["digest"],
                                "size": config["size"]},
                     "layers": layers, "annotations": {twin.SOURCE_ANNOTATION: source}})


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, Any]:
    """The image built and staged (signed evidence), two twins planted, then `publish --key`."""
    out = run_builder("build", "--select", f"id={CPU}", "--stage", "--key", str(env["key"]),
                      "--json", matrix=env["matrix"], env=env["env"])
    staged = json.loads(out.stdout)[0]["message"].rsplit("@", 1)[1]
    reg = env["reg"]
    hash_tag = tag_rules.HASH_TAG_PREFIX + real_labels(reg, "torch-staging", staged)[
        labels.CONTENT_HASH][:20]
    planted = {twin.tag_of(CPU): older_index(reg, staged),
               twin.tag_of(hash_tag): same_config_other_layers(reg, staged)}
    for tag, digest in planted.items():
        reg.tag("torch", digest, tag)
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
        head = env["reg"].head("torch", tag)
        assert head is not None and head.digest == made
        assert head.digest != digest
    result = verify(env, twin.tag_of(CPU))
    assert result.returncode == 0, result.stdout + result.stderr


def test_verify_fails_a_signed_twin_whose_layer_is_not_its_diff_id(env, published) -> None:
    reg, tag = env["reg"], twin.tag_of(CPU)
    doc = json.loads(reg.manifest("torch", published["zstd"]["digest"])[0])  # type: ignore[index]
    doc["layers"][0] = {**doc["layers"][0], **zstd_blob(reg, b"a .pth file, say")}
    forged = put(reg, doc)
    signing = keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())
    sign.sign_image(reg, "torch", forged, signing, sign.tag_annotations(CPU, [tag]))
    saved = Saved(env["addr"])
    saved.keep("torch", tag)
    try:
        reg.tag("torch", forged, tag)
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
