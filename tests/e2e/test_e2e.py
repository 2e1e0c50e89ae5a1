"""The main path for real: build → smoke → SBOM → publish → pull by digest, on a real engine and
a real registry. Builds one CUDA slim and the CUDA 13 devel image (not --force: once per run);
the CPU runtime is the session's (conftest's `shared_publication`: built, smoked, SBOM'd, staged
and published once), read here, never rebuilt or republished.

Uses the shipped matrix with the registry moved to a private port, so it never touches the
user's registry; the wheelhouse in .state/ is shared with `nox -s build` (downloads happen once).
Its matrix publishes gzip only: the zstd twin is test_zstd_twins.py's, and here it would
recompress gigabytes of CUDA layers that no assertion reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_published import Publication
from helpers import amd64_matrix, free_port, private_matrix, run_builder

from builder.core import engine, labels, registry, state

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
SLIM = "2.15.0-py3.11-cuda-slim"
DEVEL = "2.15.0-py3.11-cuda-devel"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A matrix pointing at a fresh registry on a free port; images removed afterwards."""
    tmp = tmp_path_factory.mktemp("e2e")
    port = free_port()
    addr = f"127.0.0.1:{port}"
    matrix_path = amd64_matrix(tmp, addr)
    data = yaml.safe_load(matrix_path.read_text()) | {"compression": ["gzip"]}
    matrix_path.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = tmp / "registry"
    registry.start(addr, storage)
    made: list[str] = []
    yield {"matrix": matrix_path, "addr": addr, "tmp": tmp, "made": made}
    registry.stop(storage)
    refs = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}",
                         "--filter", f"reference={addr}/*").stdout.split()
    for ref in refs + made:
        engine.remove_image(ref)


def builder(env, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], check=check)


def image_of(env, variant_id: str) -> str:
    plan = json.loads(builder(env, "plan", "--select", f"id={variant_id}", "--json").stdout)
    return plan["include"][0]["image"]


def run_in(image: str, *cmd: str, user: str | None = None) -> str:
    args = ["run", "--rm", "--network", "none"] + (["--user", user] if user else [])
    return engine.docker(*args, image, *cmd, timeout=900).stdout


@pytest.fixture(scope="module")
def built(env, shared_publication: Publication):
    """Each variant's local image: the CUDA slim and devel built (with smoke test and SBOM) here,
    the CPU runtime the session's."""
    # Not --force: an image whose content hash is built already (an earlier module, or the last
    # run's) is the same image; the CUDA slim and devel are built once per run.
    for variant in (SLIM, DEVEL):
        builder(env, "build", "--select", f"id={variant}")
    return {CPU: shared_publication.image, **{v: image_of(env, v) for v in (SLIM, DEVEL)}}


def sbom_of(image: str, state_dir: Path | None = None) -> dict:
    """The SBOM a build kept for the image's id, in `state_dir` (default: this checkout's)."""
    image_id = engine.inspect_image(image)["Id"]
    with pytest.MonkeyPatch.context() as patch:
        if state_dir is not None:
            patch.setenv("BUILDER_STATE", str(state_dir))
        return json.loads(state.evidence_path("sbom", image_id).read_text())


def test_images_carry_their_facts_and_user(built):
    for variant, image in built.items():
        lab = engine.image_labels(image)
        assert lab[labels.VARIANT] == variant
        for key in ("created", "revision", "base.name", "base.digest", "licenses", "version"):
            assert lab[labels.OCI + key], key
        assert len(lab[labels.CONTENT_HASH]) == 64 and len(lab[labels.LOCK_HASH]) == 64
        config = engine.inspect_image(image)["Config"]
        env_vars = dict(e.split("=", 1) for e in config["Env"])
        if variant == CPU:
            assert lab[labels.CUDA] == "" and "NVIDIA_REQUIRE_CUDA" not in env_vars
        else:
            assert lab[labels.CUDA] == "13.2" and lab[labels.CUDNN].startswith("9.")
            assert env_vars["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0"
            assert env_vars["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert config["User"] == ("0:0" if variant == DEVEL else "1000:1000")
    assert "triton" in engine.image_labels(built[SLIM])[labels.DROPPED]


def test_cpu_image_runs_torch_as_uid_1000(built):
    out = run_in(built[CPU], "python", "-c",
                 "import os, torch, numpy; print(os.getuid(), torch.__version__)")
    assert out.split() == ["1000", "2.13.0+cpu"]


EXTENSION = r'''
import os, re, subprocess, sys, tempfile, torch
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension, BuildExtension
from smoke.versions import cuda_arch_list, one_arch
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
release = re.search(r"release (\d+\.\d+)", nvcc).group(1)
print("nvcc", release, "torch", torch.version.cuda)
wheel = torch._C._cuda_getArchFlags()
print("wheel archs", wheel)
print("TORCH_CUDA_ARCH_LIST", os.environ["TORCH_CUDA_ARCH_LIST"], "expected", cuda_arch_list(wheel))
os.environ["TORCH_CUDA_ARCH_LIST"] = one_arch(os.environ["TORCH_CUDA_ARCH_LIST"])
print("one arch", os.environ["TORCH_CUDA_ARCH_LIST"])
d = tempfile.mkdtemp()
open(os.path.join(d, "k.cu"), "w").write("""
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
void launch(float* x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
""")
open(os.path.join(d, "b.cpp"), "w").write("""
#include <torch/extension.h>
#include <cudnn.h>
#include <nccl.h>
void launch(float* x, int n);
void run(torch::Tensor x) { launch(x.data_ptr<float>(), x.numel()); }
int cudnn_header() { return CUDNN_MAJOR; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); m.def("cudnn_header", &cudnn_header); }
""")
os.chdir(d)
sys.stdout.flush()
setup(name="k", ext_modules=[CUDAExtension("k", ["b.cpp", "k.cu"])],
      cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
      script_args=["build_ext", "--inplace"])
print("built", [f for f in os.listdir(d) if f.endswith(".so")])
'''


def test_devel_compiles_an_extension_for_the_wheels_architectures(built):
    """nvcc matches torch's CUDA; TORCH_CUDA_ARCH_LIST is read from the wheel; cudnn.h and
    nccl.h are found; the kernel is compiled for one architecture the wheel was built for (every
    one of them took minutes and proves nothing more about the toolchain)."""
    out = run_in(built[DEVEL], "python", "-c", EXTENSION)
    assert "nvcc 13.2 torch 13.2" in out
    arch_list, expected = re.search(r"TORCH_CUDA_ARCH_LIST (\S+) expected (\S+)", out).groups()
    assert arch_list == expected and arch_list, out
    wheel_sms = re.findall(r"sm_(\d+a?)", re.search(r"wheel archs (.*)", out).group(1))
    one = re.search(r"one arch (\S+)", out).group(1).replace(".", "")
    compiled_sms = set(re.findall(r"code=sm_(\d+a?)", out))
    assert one in wheel_sms and compiled_sms == {one}, (one, wheel_sms, compiled_sms)
    assert "built ['k." in out


TRAIN = """
import os, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
x = torch.randn(16, 32)
with torch.no_grad():
    eager, compiled = model(x), torch.compile(model)(x)
torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
torch.save(model.state_dict(), "checkpoint.pt")
print("compiled == eager as uid", os.getuid(), "HOME", os.environ["HOME"])
"""


def test_cpu_runtime_compiles_as_any_uid_into_a_mounted_folder(built, tmp_path):
    """`docker run --user UID:GID -v $PWD:/workspace -w /workspace IMAGE python train.py`:
    torch.compile equals eager, no cache warnings, the checkpoint lands in the host folder;
    then `torch-smoke --json` (the node check) passes in the same setting."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "train.py").write_text(TRAIN)
    uid = 1234
    if os.getuid() == 0:
        os.chown(workspace, uid, uid)
    else:  # cannot give the folder away: let any uid write, as a shared volume would
        workspace.chmod(0o777)
    args = ["run", "--rm", "--network", "none", "--user", f"{uid}:{uid}", "-v",
            f"{workspace}:/workspace", "-w", "/workspace", built[CPU]]
    result = engine.docker(*args, "python", "train.py", timeout=900)
    assert "compiled == eager as uid 1234 HOME /home/user" in result.stdout, result.stderr
    assert "warn" not in result.stderr.lower(), result.stderr
    checkpoint = workspace / "checkpoint.pt"
    assert checkpoint.stat().st_size > 0 and checkpoint.stat().st_uid == uid

    smoke = engine.docker(*args, "torch-smoke", "--json", "report.json", check=False,
                          timeout=1800)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "overall: PASS" in smoke.stdout
    report = json.loads((workspace / "report.json").read_text())
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert checks["compile"] == "pass" and checks["env"] == "pass", checks
    assert checks["cuda_libs"] == "skip"


def test_cuda_image_on_cpu_host_is_honest_and_require_gpu_fails(env, built):
    report_path = env["tmp"] / "slim-smoke.json"
    result = run_builder("smoke", built[SLIM], "--require-gpu", "--report", str(report_path),
                         check=False)  # smoke reads the image, not the matrix: no --matrix
    assert result.returncode != 0
    report = json.loads(report_path.read_text())
    statuses = {c["name"]: c for c in report["checks"]}
    assert statuses["cuda"]["status"] == "fail"
    assert statuses["cuda"].get("original_status") in ("skip", "substituted")
    assert not any(c["status"] == "pass" for n, c in statuses.items()
                   if n in ("cuda", "cudnn_conv", "nccl_allreduce"))


def test_second_build_builds_nothing(env, built):
    result = builder(env, "build", "--select", f"id={SLIM}")
    assert "0 of 1 variants to build" in result.stderr
    assert f"[{SLIM}] smoke" not in result.stderr, result.stderr  # its evidence is held


def test_sboms_have_deb_pypi_and_cuda_components(built, shared_publication: Publication):
    docs = {v: sbom_of(image, shared_publication.state if v == CPU else None)
            for v, image in built.items()}
    for variant, doc in docs.items():
        purls = [c.get("purl", "") for c in _components(doc)]
        assert any(p.startswith("pkg:deb/debian/") for p in purls), variant
        assert any(p.startswith("pkg:pypi/torch@") for p in purls), variant
        if variant != CPU:
            assert any(p.startswith("pkg:generic/nvidia/") for p in purls), variant
    torch = next(c for c in _components(docs[CPU]) if c.get("name") == "torch")
    assert torch["version"] == "2.13.0+cpu" and torch.get("licenses")


def _components(doc):
    stack = list(doc.get("components", []))
    while stack:
        c = stack.pop()
        yield c
        stack.extend(c.get("components", []))


def test_publish_and_pull_back_by_digest(env, built, shared_publication: Publication, made):
    """The CUDA slim published here (its local image pushed to staging, promoted, evidence
    attached, tagged) and the session's CPU runtime: each pulled back by digest (its layers are
    local, so the pull checks the manifest and config), every tag and the SBOM referrer there."""
    manifest = env["tmp"] / "published.json"
    # Unsigned here (recorded); tests/e2e/test_signing.py publishes signed.
    builder(env, "publish", "--select", f"id={SLIM}", "--allow-cpu-smoke",
            "--manifest", str(manifest), "--unsigned")
    [slim] = _entries(json.loads(manifest.read_text()))
    assert slim["variant"] == SLIM and slim.get("allow_cpu_smoke") is True, slim
    assert slim["pull"].startswith(env["addr"] + "/torch@sha256:"), slim
    shared = shared_publication
    cpu = {**shared.record, "variant": CPU, "pull": shared.reference}
    assert cpu["pull"].startswith(f"{shared.addr}/{shared.repository}@sha256:"), cpu
    for e in (slim, cpu):
        ref = e["pull"]
        repository, digest = ref.split("@", 1)
        engine.docker("pull", ref, timeout=1800)
        made.append(ref)
        pulled = engine.inspect_image(ref)
        assert pulled["Config"]["Labels"][labels.VARIANT] == e["variant"]
        listed = json.loads(_skopeo("list-tags", f"docker://{repository}"))["Tags"]
        sbom_tag = f"sha256-{digest.split(':')[1]}.sbom"
        assert set(e["tags"]) | {sbom_tag} <= set(listed), (e["tags"], listed)
        for tag in e["tags"]:  # each tag on this very image
            assert _skopeo("inspect", "--format", "{{.Digest}}",
                           f"docker://{repository}:{tag}").strip() == digest, tag
        json.loads(_skopeo("inspect", "--raw", f"docker://{repository}:{sbom_tag}"))


def _skopeo(*args: str) -> str:
    """skopeo (a client of its own, not the builder's) against the loopback registry."""
    result = subprocess.run(["skopeo", *args[:1], "--tls-verify=false", *args[1:]],
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def _entries(published):
    """Latest publication per variant, whatever nesting the manifest uses."""
    out = []
    variants = published.get("variants", published)
    for vid, value in variants.items():
        pubs = value if isinstance(value, list) else value.get("publications", [value])
        latest = dict(pubs[-1])
        latest.setdefault("variant", vid)
        latest["pull"] = latest["reference"]
        out.append(latest)
    return out


def test_three_machines_share_state_only_through_the_registry(shared_publication: Publication,
                                                               tmp_path):
    """Build and stage on one machine; smoke and SBOM the staged digest on a second with an
    empty .state/; publish from a third; `builder verify` on the published digest passes.
    Each machine has a state folder of its own, empty at first; the repository is a private one
    in the session's registry, so the build is the build cache's and the push mounts the
    session image's layers (no --force, no layer compressed again), and the staged image
    carries no evidence until the second machine attaches it."""
    matrix = private_matrix(tmp_path, registry=shared_publication.addr, compression=["gzip"])

    def machine(name: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_builder(*args, env={**os.environ, "BUILDER_STATE": str(tmp_path / name)},
                           **kwargs)

    outcomes = json.loads(machine("first", "build", "--select", f"id={CPU}", "--stage",
                                  "--no-smoke", "--no-sbom", "--json", matrix=matrix).stdout)
    staged = outcomes[0]["message"]
    repository = yaml.safe_load(matrix.read_text())["repository"]
    assert re.fullmatch(rf"{shared_publication.addr}/{repository}-staging@sha256:[0-9a-f]{{64}}",
                        staged), outcomes

    smoke = machine("second", "smoke", staged, "--json")
    assert json.loads(smoke.stdout)["status"] == "pass"
    machine("second", "sbom", staged, "-o", str(tmp_path / "sbom.json"))

    manifest = tmp_path / "published.json"
    machine("third", "publish", "--select", f"id={CPU}", "--manifest", str(manifest), "--json",
            "--unsigned", matrix=matrix)
    [pub] = json.loads(manifest.read_text())["variants"][CPU]["publications"]
    assert pub["digest"] == staged.rsplit("@", 1)[1]

    verified = json.loads(machine("third", "verify", pub["reference"], "--contents-only",
                                  "--json").stdout)
    assert verified["ok"] is True, verified
    checks = {c["what"]: c for c in verified["checks"]}
    assert checks["smoke"]["detail"].startswith("pass: no GPU used")
    assert "deb" in checks["sbom"]["detail"] and "pypi" in checks["sbom"]["detail"]
    assert checks["provenance"]["status"] == "ok"
