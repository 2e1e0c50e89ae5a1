"""builder.stages.build.base_layer_problem: an arm64 image built on a base other than the verified
one (its floating tag moved between verifying and BuildKit's FROM) is refused before staging;
native and pulled bases are not its business."""

from __future__ import annotations

from matrix_files import ROOT

from builder.model import matrix, platforms
from builder.stages import build

VERIFIED = "sha256:" + "a" * 64
M = matrix.load(ROOT / "matrix.yaml")
[ARM] = M.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])
[AMD] = M.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/amd64"])
BASE = platforms.layers_digest([VERIFIED])


def test_an_arm64_image_on_its_verified_base_passes() -> None:
    assert build.base_layer_problem(ARM, BASE, [VERIFIED, "sha256:" + "b" * 64]) == ""


def test_an_arm64_image_on_another_base_is_refused_naming_both() -> None:
    planted = "sha256:" + "c" * 64
    problem = build.base_layer_problem(ARM, BASE, [planted, "sha256:" + "b" * 64])
    assert problem.startswith("the image was built on another base than the verified one: its "
                              f"first layer {planted[:19]} is not that of base digest {BASE[:19]}")
    assert problem.endswith("the image was removed")
    assert "first layer none" in build.base_layer_problem(ARM, BASE, [])


def test_a_native_base_or_an_unknown_digest_is_not_checked_here() -> None:
    assert build.base_layer_problem(AMD, BASE, ["sha256:" + "c" * 64]) == ""
    assert build.base_layer_problem(ARM, None, ["sha256:" + "c" * 64]) == ""
