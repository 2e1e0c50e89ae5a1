"""The devel image's arch list (read from the wheel) and the one arch the nvcc check builds for."""

from __future__ import annotations

from smoke.versions import cuda_arch_list, one_arch


def test_the_wheels_flags_become_a_torch_cuda_arch_list() -> None:
    assert cuda_arch_list("sm_75 sm_90a compute_120") == "7.5;9.0a;12.0+PTX"


def test_one_arch_is_the_first_real_architecture() -> None:
    assert one_arch("7.5;9.0a;12.0+PTX") == "7.5"
    assert one_arch("12.0+PTX") == "12.0"  # only PTX: compile that arch
    assert one_arch("") == ""
