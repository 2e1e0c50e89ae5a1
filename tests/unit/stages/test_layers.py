"""Layer order and content of the rendered Dockerfiles: what makes images share registry blobs,
installs hash-checked, and keeps the CA bundle out of every layer."""

from __future__ import annotations

import hashlib
import itertools
import re

import pytest
from rendering import LOCKS, rendered

from builder.model import flavors, lockfile
from builder.model.rendered import Rendered, Step
from builder.stages import render
from builder.stages.wheelhouse import local_wheels


def instructions(dockerfile: str) -> list[str]:
    """The instructions (continuations joined, comments dropped) up to the per-image tail."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if "source=smoke," in line:  # the node check: the per-image tail
            break
        if line.strip():
            out.append(" ".join(line.split()))
    while out and out[-1].startswith("USER"):  # the image's final user is the tail's business
        out.pop()
    return out


@pytest.mark.parametrize("prefix", ["2.15.0-py3.11-cuda", "2.13.0-py3.11-cpu"])
def test_slim_is_a_prefix_of_runtime_and_runtime_of_devel(shipped, prefix):
    ids = [f"{prefix}-{f}" for f in ("slim", "runtime", "devel")]
    seqs = [instructions(rendered(shipped, vid).dockerfile)
            for vid in ids if vid in {v.id for v in shipped.variants}]
    for shorter, longer in itertools.pairwise(seqs):
        assert longer[:len(shorter)] == shorter
        assert len(longer) > len(shorter)


def test_runtime_adds_triton_and_restores_torch_headers_only(shipped):
    slim = instructions(rendered(shipped, "2.15.0-py3.11-cuda-slim").dockerfile)
    runtime = instructions(rendered(shipped, "2.15.0-py3.11-cuda-runtime").dockerfile)
    extra = runtime[len(slim):]
    assert not any("triton" in line for line in slim)
    assert any("--link-mode copy" in line for line in extra)  # triton
    restores = [line for line in extra if "cp -rL --parents" in line]
    assert len(restores) == 1 and "-name include" in restores[0]
    assert "rm -rf {} +" not in " ".join(extra)  # later layers only add: nothing is whited out


def nvidia_run(r: Rendered) -> str:
    return next(line for line in instructions(r.dockerfile) if render.NVIDIA_SITE in line
                and "--link-mode copy" in line)


def test_nvidia_layer_is_the_same_instruction_for_every_python_and_flavor(shipped):
    runs = {vid: nvidia_run(rendered(shipped, vid)) for vid in (
        "2.15.0-py3.11-cuda-slim", "2.15.0-py3.11-cuda-runtime", "2.15.0-py3.11-cuda-devel",
        "2.15.0-py3.12-cuda-runtime")}
    parts = {vid: render.lock_parts((lockfile.read_base_lock(LOCKS, shipped.variant(vid))
                                     or lockfile.require_lock(LOCKS, shipped.variant(vid))).text)
             ["nvidia"] for vid in runs}
    first = next(iter(runs))
    for vid, run in runs.items():
        if parts[vid] == parts[first]:
            assert run == runs[first], vid
        assert "python3." not in run  # python-independent location
        assert "touch -h -d @" in run  # fixed file times


def test_cuda_bindings_stay_out_of_the_shared_nvidia_part():
    assert render.part_of("cuda-bindings") == "torch"
    assert render.part_of("nvidia-cudnn-cu13") == "nvidia"
    assert render.part_of("triton") == "triton"


def test_every_install_is_hash_checked_and_the_ca_bundle_only_a_secret(shipped):
    ca = "/etc/ssl/certs/ca-certificates.crt"
    for v in shipped.variants:
        text = rendered(shipped, v.id).dockerfile
        installs = re.findall(r"(?:uv|pip) pip install[^;}]*|pip install[^\n]*", text)
        assert installs and all("--require-hashes" in i for i in installs), v.id
        for line in text.splitlines():
            if ca in line:
                assert ("--mount=type=secret" in line or f"SSL_CERT_FILE={ca}" in line
                        or f"-path {ca}" in line), line  # (settle skips the mounted file)
            assert not line.startswith(("COPY", "ADD")) or "ca-cert" not in line


def test_dropped_follows_the_flavor_table():
    assert flavors.dropped("slim")[:4] == ["triton", "compilers", "headers", "static-libraries"]
    assert "compilers" not in flavors.dropped("runtime") + flavors.dropped("devel")
    assert "headers-except-torch" in flavors.dropped("runtime")
    assert "triton" not in flavors.dropped("runtime")
    assert "perl" not in flavors.dropped("devel") and "perl" in flavors.dropped("runtime")
    assert not any(d.startswith(("headers", "static")) for d in flavors.dropped("devel"))


def test_set_folders_never_collide_with_the_old_wheel_sets():
    step = Step(name="rest", requirements="numpy==1 \\\n    --hash=sha256:00\n")
    assert step.set_id != hashlib.sha256(step.requirements.encode()).hexdigest()[:20]


def test_local_wheels_match_name_and_version(tmp_path):
    for name in ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "typing_extensions-4.16.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    reqs = "torch==2.13.0+cpu \\\n    --hash=sha256:aa\ntyping-extensions==4.16.0 \\\n"
    found = [p.name for p in local_wheels([str(tmp_path), "/nonexistent"], reqs)]
    assert found == ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                     "typing_extensions-4.16.0-py3-none-any.whl"]
