"""The registry's build cache is taken only as a trusted key signed it (builder.stages.signed_cache):
by digest when a signature over that digest names its `cache-<tag>`; otherwise not at all, and
the line says why — unsigned, another key, a tag moved to another signed digest, absent, no
trusted key, --no-registry-cache. Against an in-memory registry."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from matrix_files import LOCKS, ROOT
from memregistry import MemoryRegistry

from builder.core import keypair, oci, sign
from builder.core.keypair import Vouchers
from builder.flows import build as build_flow
from builder.model import matrix, platforms
from builder.stages import build, plan, render, signed_cache, staging

M = matrix.load(ROOT / "matrix.yaml")
VARIANT = "2.13.0-py3.11-cpu-runtime"
REF = build.cache_ref(M, f"{M.registry}/{M.repository}:{VARIANT}")
TAG = signed_cache.cache_tag(REF)


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def cache_image(reg: MemoryRegistry, layer: bytes, tag: str = TAG) -> str:
    """A one-layer image under `tag` in the staging repository; returns its digest."""
    config = json.dumps({"rootfs": {"diff_ids": [oci.sha256(layer)]}}).encode()
    body = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                       "config": {"digest": reg.push_blob(M.staging_repository, config)},
                       "layers": [{"digest": reg.push_blob(M.staging_repository, layer)}]})
    return reg.put_manifest(M.staging_repository, tag, body.encode(), oci.OCI_MANIFEST)


def signed(reg: MemoryRegistry, digest: str, key: keypair.SigningKey, tag: str = TAG) -> None:
    """What `build --stage --key` does (staging.push_cache), `docker push` reporting `digest`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(staging, "push", lambda *a, **kw: f"{tag}: digest: {digest} size: 9")
        mp.setattr(staging.oci, "Registry", lambda *_: reg)
        staging.push_cache(M, f"x:{tag}", key, "2.13.0-py3.11-cpu-runtime")


def choose(reg: MemoryRegistry, keys: list, **kw: bool) -> signed_cache.Choice:
    return signed_cache.choose(M, REF, Vouchers(tuple(keys)), reg=reg, **kw)


@pytest.fixture
def reg() -> MemoryRegistry:
    return MemoryRegistry(M.staging_registry)


def test_a_signed_cache_is_taken_by_the_digest_the_key_signed(reg) -> None:
    key = new_key()
    digest = cache_image(reg, b"genuine layer")
    signed(reg, digest, key)
    got = choose(reg, [key.public])
    assert got.refs == (f"{M.staging_registry}/{M.staging_repository}@{digest}",)
    assert got.line == (f"registry cache `{REF}`: used as `{got.refs[0]}`, its signature "
                        f"verified against the trusted key {keypair.key_id(key.public)}")


def test_a_replaced_cache_image_is_not_used_saying_why(reg) -> None:
    """The attack: push rights to the staging repository, the tag moved to a poisoned image."""
    key = new_key()
    signed(reg, cache_image(reg, b"genuine layer"), key)
    cache_image(reg, b"a layer adding evil.pth to site-packages")
    got = choose(reg, [key.public])
    assert got.refs == ()
    assert got.line.startswith(f"registry cache `{REF}`: not used: its signature did not "
                               "verify: published unsigned: no signature")


def test_a_cache_signed_by_another_key_is_not_used(reg) -> None:
    signed(reg, cache_image(reg, b"layer"), new_key())
    got = choose(reg, [new_key().public])
    assert got.refs == ()
    assert got.line.endswith("not used: its signature did not verify: no valid signature: a "
                             "signature by another key")


def test_a_signed_digest_moved_under_another_variants_cache_tag_is_not_used(reg) -> None:
    """A genuine signature names the tag it was made for: another variant's signed cache
    moved under this tag is refused."""
    key = new_key()
    other = cache_image(reg, b"the slim's layer", tag="cache-2.13.0-py3.11-cpu-slim")
    signed(reg, other, key, tag="cache-2.13.0-py3.11-cpu-slim")
    reg.tag(M.staging_repository, other, TAG)
    got = choose(reg, [key.public])
    assert got.refs == ()
    assert got.line.endswith(f"its signature does not name the tag `{TAG}` (the tag was moved "
                             "to another signed digest?)")


@pytest.mark.parametrize(("keys", "wanted", "why"), [
    ("ours", False, "--no-registry-cache"),
    ("none", True, signed_cache.NO_KEY),
    ("ours", True, "absent"),
])
def test_without_a_key_an_image_or_the_wish_no_cache_is_used(reg, keys, wanted, why) -> None:
    key = new_key()
    got = choose(reg, [key.public] if keys == "ours" else [], wanted=wanted)
    assert got == signed_cache.Choice((), f"registry cache `{REF}`: not used: {why}")


def test_an_unreadable_registry_means_no_cache(reg, monkeypatch) -> None:
    def refuse(*_: object) -> None:
        raise oci.RegistryError("connection refused")

    monkeypatch.setattr(reg, "head", refuse)
    got = choose(reg, [new_key().public])
    assert got.refs == () and got.line.endswith("not used: it cannot be read: connection refused")


def test_the_signature_names_the_cache_tag_and_the_variant(reg) -> None:
    key = new_key()
    digest = cache_image(reg, b"layer")
    signed(reg, digest, key)
    [payload] = sign.verified_payloads(reg, M.staging_repository, digest,  # type: ignore[arg-type]
                                       [key.public])
    assert sign.signed_tags(payload["optional"]) == {TAG}
    assert payload["optional"]["variant"] == "2.13.0-py3.11-cpu-runtime"


def test_the_digest_signed_is_the_one_docker_push_reported() -> None:
    digest = "sha256:" + "ab" * 32
    output = f"The push refers to repository [r/x-staging]\ncache-t: digest: {digest} size: 9"
    assert staging.pushed_digest(output) == digest
    assert staging.pushed_digest("no digest here") == ""


def test_staging_signs_the_pushed_digest_never_the_tags_digest(reg) -> None:
    """`build --stage --key`: the digest `docker push` reported is signed, never one read back
    from the tag (which anyone with push rights may have replaced meanwhile)."""
    key, digest = new_key(), cache_image(reg, b"genuine layer")
    cache_image(reg, b"replaced while pushing")
    signed(reg, digest, key)
    assert sign.names_tag(reg, M.staging_repository, digest, TAG,  # type: ignore[arg-type]
                          [key.public])
    assert choose(reg, [key.public]).refs == ()  # the replaced tag is not what was signed
    reg.tag(M.staging_repository, digest, TAG)
    assert choose(reg, [key.public]).refs == (f"{M.staging_registry}/{M.staging_repository}@"
                                              f"{digest}",)


def test_the_build_step_gives_buildkit_only_the_chosen_references_and_says_why(
        monkeypatch, tmp_path, capsys) -> None:
    """flows/build's BuildKit step asks `choose` with the run's trusted keys (the --key's own
    when no --trust-key) and passes BuildKit exactly what it chose."""
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path))
    [v] = M.select([f"id={VARIANT}", "platform=linux/amd64"])
    p = plan.plan_variant(M, render.render_locked(M, v, LOCKS),
                          platforms.layers_digest(["sha256:" + "a" * 64]), "smoke")
    key, asked, given = new_key(), [], []
    chosen = signed_cache.Choice(("r/x-staging@sha256:" + "e" * 64,), "registry cache: chosen")
    monkeypatch.setattr(signed_cache, "choose",
                        lambda m, ref, keys, wanted: asked.append((ref, keys, wanted)) or chosen)
    monkeypatch.setattr(build, "build_labels", lambda *a: {})
    monkeypatch.setattr(build, "build_from_registry_cache",
                        lambda spec, cache: given.append(cache) or "sha256:built")
    monkeypatch.setattr(build_flow.reproducible, "normalise_image", lambda i, ref, keep: i)
    monkeypatch.setattr(build_flow.engine, "inspect_image",
                        lambda ref: {"Id": ref, "Size": 1, "RootFS": {"Layers": []}})
    run = build_flow.Run(M, build_flow.BuildOptions(locks=LOCKS, key=key),
                         build_flow.Wheelhouse())
    o = build_flow.buildkit(run, build_flow.Outcome(variant_id=v.key, state="build", image=p.local_image, planned=p))
    assert o.state == "built"
    assert asked == [(build.cache_ref(M, p.local_image), Vouchers((key.public,)), True)]
    assert given == [list(chosen.refs)]
    assert f"[{v.key}] registry cache: chosen" in capsys.readouterr().err
