"""What each flavor renders to: compilers in runtime/devel, none in slim; any-uid HOME; the node
check; devel's arch list; the python 3.13 variant; the Kubernetes node-check example."""

from __future__ import annotations

import json
import re

import pytest
from rendering import LOCKS, rendered

from builder.model import lockfile
from builder.stages import render
from smoke.checks.compile import skip_reason


def apt_packages(dockerfile: str) -> list[str]:
    """The packages of every apt-get install in the Dockerfile."""
    blocks = [part.split("&&", 1)[0] for part in dockerfile.split("--no-install-recommends")[1:]]
    return [pkg for block in blocks for pkg in re.findall(r"^\s+([a-z0-9.+-]+) \\$", block, re.M)]


@pytest.mark.parametrize("variant_id", [
    "2.13.0-py3.11-cpu-runtime", "2.15.0-py3.11-cuda-runtime", "2.15.0-py3.11-cuda-devel",
    "2.15.0-py3.13-cuda-runtime",
])
def test_runtime_and_devel_carry_the_compile_toolchain(shipped, variant_id):
    r = rendered(shipped, variant_id)
    assert {"g++", "libpython3-dev"} <= set(apt_packages(r.dockerfile))
    assert "compilers" not in r.facts["dropped"]
    assert skip_reason({"facts": r.facts}) is None  # the compile check runs


@pytest.mark.parametrize("variant_id", ["2.13.0-py3.11-cpu-slim", "2.15.0-py3.13-cuda-slim"])
def test_slim_is_compiler_free_and_says_so(shipped, variant_id):
    r = rendered(shipped, variant_id)
    assert not {"g++", "libpython3-dev", "build-essential"} & set(apt_packages(r.dockerfile))
    assert "io.torch-images.dropped=\"triton,compilers," in r.dockerfile
    reason = skip_reason({"facts": r.facts})
    assert reason and "compiler-free" in reason


def test_every_image_has_the_node_check_and_an_any_uid_home(shipped):
    for variant in shipped.variants:
        text = rendered(shipped, variant.id).dockerfile
        assert "HOME=/home/user" in text and "chmod 1777 /home/user" in text, variant.id
        site = render.site_packages(variant)
        assert f"echo /opt/torch-images > {site}/torch_images_smoke.pth" in text, variant.id
        assert "/opt/venv/bin/python -m smoke" in text and "/opt/venv/bin/torch-smoke" in text


def test_devel_sets_arch_list_from_the_wheel_and_library_headers(shipped):
    devel = rendered(shipped, "2.15.0-py3.13-cuda-devel").dockerfile
    site = "/opt/venv/lib/python3.13/site-packages"
    assert "torch._C._cuda_getArchFlags()" in devel and "cuda_arch_list" in devel
    assert "os.environ.setdefault('TORCH_CUDA_ARCH_LIST'" in devel
    assert f"CUDA_HOME={render.NVIDIA_SITE}/nvidia/cu13" in devel
    assert f"CUDNN_HOME={site}/nvidia/cudnn" in devel
    assert f"{site}/nvidia/nccl/include" in devel
    # computed after the smoke package is in place (it reads the wheel's arch flags)
    assert devel.index("/opt/torch-images/smoke") < devel.index("cuda_arch_list") < devel.index("HOME=/root")


def test_facts_carry_the_locked_nvidia_wheels(shipped):
    r = rendered(shipped, "2.15.0-py3.11-cuda-devel")
    pins = lockfile.require_lock(LOCKS, shipped.variant("2.15.0-py3.11-cuda-devel")).pins
    assert r.facts["wheels"] == {k: v for k, v in pins.items() if k.startswith("nvidia-")}
    assert "nvidia-cuda-nvcc" in r.facts["wheels"]  # devel's toolkit wheels too
    assert rendered(shipped, "2.13.0-py3.11-cpu-runtime").facts["wheels"] == {}
    assert json.loads(r.files[r.facts_source])["wheels"] == r.facts["wheels"]


def test_python_313_comes_from_trixie_for_the_cuda13_torch(shipped):
    ids = {v.id for v in shipped.variants if v.python == "3.13"}
    assert ids == {f"2.15.0-py3.13-cuda-{f}" for f in ("devel", "runtime", "slim")}
    for variant_id in ids:
        variant = shipped.variant(variant_id)
        assert variant.base.image == "mmdebstrap:trixie" and variant.base.python_from == "apt"
        lock = lockfile.require_lock(LOCKS, variant)
        assert lock.facts["cuda"] == "13.2" and lock.facts["python"] == "3.13"
        r = rendered(shipped, variant_id)
        assert len(re.findall(r"^FROM torch-images-base:trixie\S* AS os$", r.dockerfile, re.M)) == 1
        assert 'io.torch-images.python="3.13"' in r.dockerfile


def test_python_axis_gets_its_own_wheels(shipped):
    """The same lock lines list every python's wheel hashes: a cp311 wheel must not be linked
    into a py3.13 build, and the install sets of the two pythons are distinct."""
    from builder.stages.wheelhouse import installable

    cp311 = "cuda_bindings-13.5.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
    cp313 = cp311.replace("cp311", "cp313")
    assert installable(cp311, "3.11") and not installable(cp311, "3.13")
    assert installable(cp313, "3.13")
    assert installable("nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl", "3.13")
    assert installable("filelock-4.3.1-py3-none-any.whl", "3.13")
    assert not installable("not-a-wheel.tar.gz", "3.13")
    # uv picks each wheel by the image's own interpreter, so the NVIDIA step (python-independent
    # wheels) is one layer for both pythons, while torch's (cp311 / cp313 wheels) differs.
    steps = {v: {s.name: s for s in rendered(shipped, f"2.15.0-py{v}-cuda-slim").steps}
             for v in ("3.11", "3.13")}
    assert steps["3.11"]["nvidia"].set_id == steps["3.13"]["nvidia"].set_id
