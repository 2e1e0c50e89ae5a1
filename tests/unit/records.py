"""Sample publication records for unit tests (imported as `records`)."""

from __future__ import annotations

from typing import Any

from builder.model.publication import Artifact, PlatformEntry, Publication

DIGEST = "sha256:" + "d" * 64


def artifact(kind: str, digest: str = DIGEST) -> Artifact:
    return Artifact(tag=f"sha256-{digest[7:]}.{kind}", digest="sha256:" + "f" * 64,
                    media_type=f"application/vnd.torch-images.{kind}+json",
                    reference=f"127.0.0.1:5000/torch@sha256:{'f' * 64}")


def publication(**overrides: Any) -> Publication:
    values: dict[str, Any] = dict(
        date="2026-12-04", published_at="2026-12-04T07:00:00Z", registry="127.0.0.1:5000",
        repository="torch", digest=DIGEST, reference=f"127.0.0.1:5000/torch@{DIGEST}",
        image_id="sha256:" + "e" * 64, content_hash="c" * 64,
        tags=("2.13.0-py3.11-cpu-runtime-20261204", "build-" + "c" * 20,
              "2.13.0-py3.11-cpu-runtime"),
        dated_tag="2.13.0-py3.11-cpu-runtime-20261204", hash_tag="build-" + "c" * 20,
        floating_tag="2.13.0-py3.11-cpu-runtime", aliases=(), torch="2.13.0+cpu", python="3.11",
        accelerator="cpu", cuda=None, cudnn=None, nccl=None, min_driver=None, flavor="runtime",
        sbom=artifact("sbom"), smoke_report=artifact("smoke"), provenance=artifact("provenance"))
    return Publication(**(values | overrides))


def platform_entry(platform: str, digest: str, **overrides: Any) -> PlatformEntry:
    return PlatformEntry(platform=platform, digest=digest, sbom=artifact("sbom", digest),
                         smoke_report=artifact("smoke", digest), **overrides)
