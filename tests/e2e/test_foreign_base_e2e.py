"""An arm64 base served from a real registry, for real except the emulated bootstrap (no qemu on
this machine: this engine's bookworm rootfs stands in for the arm64 one): builder.flows.bases
pushes it signed and attested and gives the build its reference by digest; BuildKit builds
`--platform linux/arm64` (no RUN step, so nothing is emulated) FROM that `BASE_IMAGE` onto the
very layer it verified. An attacker with push rights moves the floating tag to a planted base: a
build given the verified reference is not moved; one FROM the tag is refused by the post-build
check; the next base step takes the signed base again, by the same digest.
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
from builder.stages import base, build, render

pytestmark = pytest.mark.docker

ARM = platforms.get("linux/arm64")


def stand_in_bootstrap(suite: str, platform: platforms.Platform, key: str, folder: Path,
                       progress: object) -> tuple[bytes, Path]:
    """This engine's slim bootstrap of `suite` as the arm64 one (configured for arm64)."""
    base.bootstrap(suite)
    _config, tar = base.export_bootstrapped(suite, folder)
    return base.foreign_config(suite, platform, tar, key), tar


def planted_base(tmp: Path) -> tuple[bytes, Path]:
    """Another arm64 rootfs: one file."""
    (tmp / "backdoor").write_text("planted\n")
    tar = tmp / "planted.tar"
    with tarfile.open(tar, "w") as out:
        out.add(tmp / "backdoor", arcname="backdoor")
    return base.foreign_config("bookworm", ARM, tar, "planted"), tar


def build_on(floating: str, pinned: str | None, tmp: Path, made: list[str]) -> list[str]:
    """`docker build --platform linux/arm64` of the FROM line the templates write for a base
    the registry serves (BASE_IMAGE, its default the floating tag), given `pinned` as the build
    argument when not None; the image's layers."""
    ctx = tmp / f"ctx-{uuid.uuid4().hex[:8]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"ARG BASE_IMAGE={floating}\nFROM ${{BASE_IMAGE}} AS os\n"
                                    "LABEL e2e=foreign-base\n")
    image = f"e2e-foreign-{uuid.uuid4().hex[:8]}:arm64"
    pin = ["--build-arg", f"BASE_IMAGE={pinned}"] if pinned else []
    engine.docker("build", "-q", "--pull", "--platform", "linux/arm64", *pin, "-t", image,
                  str(ctx), timeout=600)
    made.append(image)
    return (engine.inspect_image(image) or {})["RootFS"]["Layers"]


def test_an_arm64_build_stands_on_the_verified_base_whatever_the_floating_tag_says(
        tmp_path: Path, registry_addr: str, made: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = matrix.load(private_matrix(tmp_path, registry=registry_addr))
    [variant] = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])
    monkeypatch.setattr(base, "bootstrap_foreign", stand_in_bootstrap)
    key = keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))
    said: list[str] = []
    trusted = keypair.Vouchers(keys=(key.public,))
    first = bases.ensure_all(m, [variant], bases.BaseOptions(trusted, key), said.append)
    assert said[-1].endswith(f"signed and attested by key {keypair.key_id(key.public)}")
    [digest], [pinned] = first.digests.values(), first.pins.values()
    floating = render.base_ref(variant, m)
    assert f"ARG BASE_IMAGE={floating}\n" in render.render_locked(
        m, variant, Path(__file__).parents[2] / "locks").dockerfile
    made.extend([floating, pinned])
    assert build.base_layer_problem(variant, digest, build_on(floating, pinned, tmp_path,
                                                              made)) == ""

    reg, repository = oci.Registry(registry_addr), platforms.base_repository(m.repository)
    config, tar = planted_base(tmp_path)
    rootfs_image.push(reg, repository, tar, config, [floating.rsplit(":", 1)[1]])
    assert build.base_layer_problem(variant, digest, build_on(floating, pinned, tmp_path,
                                                              made)) == ""
    moved = build.base_layer_problem(variant, digest, build_on(floating, None, tmp_path, made))
    assert moved.startswith("the image was built on another base than the verified one")

    said.clear()
    again = bases.ensure_all(m, [variant], bases.BaseOptions(trusted), said.append)
    assert again == first
    assert said == [f"base {pinned.split('@')[0]}:bookworm-slim-arm64-"
                    f"{base.bootstrap_key('bookworm', options=base.SLIM_OPTIONS)}: taken "
                    f"({pinned.split('@')[1][:19]}), its signature and provenance verified "
                    f"against the trusted key {keypair.key_id(key.public)}"]
