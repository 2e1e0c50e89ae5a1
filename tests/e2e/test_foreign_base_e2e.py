"""An arm64 base served from a real registry, for real except the emulated bootstrap (no qemu on
this machine: this engine's bookworm rootfs stands in for the arm64 one): builder.flows.bases
pushes it signed and attested, points the floating tag at it, and BuildKit builds
`--platform linux/arm64` FROM that tag (no RUN step, so nothing is emulated) onto the very layer
it verified. An attacker with push rights moves the floating tag to a planted base: an image
built while it points there is refused by the post-build check, and the next build's base step
verifies the keyed bootstrap and points the tag back.
"""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from helpers import private_matrix

from builder.core import engine, keypair, oci, rootfs_image
from builder.flows import bases
from builder.model import matrix, platforms
from builder.stages import base, build

pytestmark = pytest.mark.docker

ARM = platforms.get("linux/arm64")


def stand_in_bootstrap(suite: str, platform: platforms.Platform, folder: Path,
                       progress: object) -> tuple[bytes, Path]:
    """This engine's slim bootstrap of `suite` as the arm64 one (configured for arm64)."""
    base.bootstrap(suite)
    _config, tar = base.export_bootstrapped(suite, folder)
    return base.foreign_config(suite, platform, tar), tar


def planted_base(tmp: Path) -> tuple[bytes, Path]:
    """Another arm64 rootfs: one file."""
    (tmp / "backdoor").write_text("planted\n")
    tar = tmp / "planted.tar"
    with tarfile.open(tar, "w") as out:
        out.add(tmp / "backdoor", arcname="backdoor")
    return base.foreign_config("bookworm", ARM, tar), tar


def build_on(ref: str, tmp: Path, made: list[str]) -> list[str]:
    """`docker build --platform linux/arm64` FROM `ref` (pulled afresh), one label; its layers."""
    ctx = tmp / f"ctx-{uuid.uuid4().hex[:8]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {ref}\nLABEL e2e=foreign-base\n")
    image = f"e2e-foreign-{uuid.uuid4().hex[:8]}:arm64"
    engine.docker("build", "-q", "--pull", "--platform", "linux/arm64", "-t", image, str(ctx),
                  timeout=600)
    made.append(image)
    return (engine.inspect_image(image) or {})["RootFS"]["Layers"]


def test_an_arm64_build_stands_on_the_verified_base_and_a_moved_tag_is_caught(
        tmp_path: Path, registry_addr: str, made: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = matrix.load(private_matrix(tmp_path, registry=registry_addr))
    [variant] = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])
    monkeypatch.setattr(base, "bootstrap_foreign", stand_in_bootstrap)
    key = keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))
    said: list[str] = []
    digest = bases.ensure(m, variant, bases.BaseOptions((key.public,), key), said.append)
    assert said[-1].endswith(f"signed and attested by key {keypair.key_id(key.public)}")

    floating = f"{registry_addr}/{platforms.base_repository(m.repository)}:" \
               f"{platforms.base_tag('bookworm', 'arm64')}"
    made.append(floating)
    layers = build_on(floating, tmp_path, made)
    assert build.base_layer_problem(variant, digest, layers) == ""

    reg, repository = oci.Registry(registry_addr), platforms.base_repository(m.repository)
    signed = reg.head(repository, "bookworm-slim-arm64")
    config, tar = planted_base(tmp_path)
    rootfs_image.push(reg, repository, tar, config, ["bookworm-slim-arm64"])
    problem = build.base_layer_problem(variant, digest, build_on(floating, tmp_path, made))
    assert problem.startswith("the image was built on another base than the verified one")

    said.clear()
    assert bases.ensure(m, variant, bases.BaseOptions((key.public,)), said.append) == digest
    assert said == [f"base {floating}: taken from `{floating}-"
                    f"{base.bootstrap_key('bookworm', options=base.SLIM_OPTIONS)}` "
                    f"({signed.digest[:19]}), its signature and provenance verified against "  # type: ignore[union-attr]
                    f"the trusted key {keypair.key_id(key.public)}"]
    assert reg.head(repository, "bookworm-slim-arm64") == signed
    assert build.base_layer_problem(variant, digest, build_on(floating, tmp_path, made)) == ""
