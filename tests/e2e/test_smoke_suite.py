"""The in-image smoke suite (`python -m smoke`), run on this CPU host with a CPU torch.

The suite's subprocess tests need a Python with torch. They use, in order: $SMOKE_TEST_PYTHON,
`.venv-smoke/bin/python` in the repo root, `/work/venvs/torchcpu/bin/python`; without one they
are skipped. CI makes one with:

    python -m venv .venv-smoke && .venv-smoke/bin/pip install torch==2.13.0 numpy

(on a host with the CPU wheel: `.venv-smoke/bin/pip install /path/to/torch-2.13.0+cpu-*.whl
numpy`). The pure-function tests at the end need no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import missing

from smoke import ERROR, FAIL, PASS, SKIP, SUBSTITUTED
from smoke.checks.common import summarize
from smoke.checks.env import mismatches
from smoke.facts import load_facts
from smoke.runner import apply_require_gpu, interpret, overall
from smoke.versions import (
    arch_supported,
    cuda_arch_list,
    cudnn_version_str,
    driver_problem,
    minimum_driver,
    nccl_version_str,
    runtime_matches_wheel,
    torch_matches,
    wheel_mismatches,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "smoke" / "report.schema.json").read_text())
CPU_FACTS = {
    "variant": "2.13.0-py3.11-cpu-runtime", "torch": "2.13.0+cpu", "python": "3.11",
    "accelerator": "cpu", "cuda": None, "cudnn": None, "nccl": None, "triton": None,
    "flavor": "runtime", "min_driver": None, "dropped": [],
}
# What a CUDA image would promise; on this host its GPU checks must not pass.
CUDA_FACTS = {
    "variant": "2.15.0-py3.11-cuda-runtime", "torch": "2.15.0", "python": "3.11",
    "accelerator": "cuda", "cuda": "13.2", "cudnn": "9.26.0", "nccl": "2.30.7",
    "triton": "3.9.0", "flavor": "runtime", "min_driver": "580.65.06", "dropped": [],
}


def _torch_python() -> str | None:
    candidates = [os.environ.get("SMOKE_TEST_PYTHON"), str(REPO / ".venv-smoke/bin/python"),
                  "/work/venvs/torchcpu/bin/python"]
    for candidate in filter(None, candidates):
        if Path(candidate).is_file():
            probe = subprocess.run([candidate, "-c", "import torch"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


TORCH_PYTHON = _torch_python()
# Under CI a missing torch venv is a failure (tools/setup.sh makes it), never a skip.
needs_torch = pytest.mark.skipif(
    TORCH_PYTHON is None and os.environ.get("CI") != "true",
    reason="no Python with torch: set SMOKE_TEST_PYTHON or create .venv-smoke "
    "(python -m venv .venv-smoke && .venv-smoke/bin/pip install torch==2.13.0 numpy)",
)


def validate(report: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(report)


def run_suite(
    tmp: Path, facts: dict[str, Any] | None, *args: str, env: dict[str, str] | None = None,
    python: str | None = None,
) -> tuple[int, dict[str, Any], str]:
    """(exit code, report from stdout, stderr table) of `python -m smoke --report -`."""
    argv = [python or TORCH_PYTHON or sys.executable, "-m", "smoke", "--report", "-", *args]
    if facts is not None:
        facts_file = tmp / "image.json"
        facts_file.write_text(json.dumps(facts))
        argv += ["--facts", str(facts_file)]
    full_env = {**os.environ, **(env or {})}
    for hook in ("SMOKE_TEST_HANG", "SMOKE_TEST_CRASH"):
        if hook not in (env or {}):
            full_env.pop(hook, None)
    proc = subprocess.run(argv, cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


# ---- full runs (module-scoped: each configuration runs once) ---------------------------------


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    if TORCH_PYTHON is None:
        missing("no Python with torch (tools/setup.sh makes .venv-smoke)")
    checks = "env,cuda,cudnn_conv,nccl_allreduce,amp_train,import_all"
    return run_suite(tmp_path_factory.mktemp("cpu"), CPU_FACTS, "--checks", checks,
                     "--image-ref", "local/torch:cpu", "--image-id", "sha256:" + "ab" * 32)


@pytest.fixture(scope="module")
def cuda_on_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    if TORCH_PYTHON is None:
        missing("no Python with torch (tools/setup.sh makes .venv-smoke)")
    return run_suite(tmp_path_factory.mktemp("cuda"), CUDA_FACTS,
                     "--checks", "cuda,cudnn_conv,nccl_allreduce,amp_train")


@needs_torch
def test_cpu_image_passes(cpu_run: tuple[int, dict[str, Any], str]) -> None:
    rc, report, table = cpu_run
    checks = by_name(report)
    assert rc == 0 and report["status"] == PASS, table
    assert {n: c["status"] for n, c in checks.items()} == {
        "env": PASS, "cuda": SKIP, "cudnn_conv": PASS, "nccl_allreduce": PASS,
        "amp_train": PASS, "import_all": PASS,
    }
    assert checks["cudnn_conv"]["metrics"]["max_rel_err"] <= 1e-5
    assert checks["nccl_allreduce"]["metrics"]["world_size"] == 2
    assert checks["nccl_allreduce"]["metrics"]["busbw_gbps"] > 0
    losses = checks["amp_train"]["metrics"]["losses"]
    assert losses[-1] < losses[0]
    assert report["image"]["ref"] == "local/torch:cpu"
    assert "overall: PASS" in table  # with --json to stdout, the table goes to stderr
    validate(report)


@needs_torch
def test_cuda_image_on_cpu_host_never_passes_gpu_checks(
    cuda_on_cpu_run: tuple[int, dict[str, Any], str],
) -> None:
    rc, report, _ = cuda_on_cpu_run
    checks = by_name(report)
    assert checks["cuda"]["status"] == SKIP
    assert "no GPU visible" in checks["cuda"]["message"] or "without CUDA" in checks["cuda"][
        "message"]
    for name in ("cudnn_conv", "nccl_allreduce", "amp_train"):
        assert checks[name]["status"] == SUBSTITUTED, checks[name]
        assert "CPU stand-in" in checks[name]["message"]
    assert rc == 0 and report["status"] == PASS
    validate(report)


@needs_torch
def test_require_gpu_fails_substituted_checks(tmp_path: Path) -> None:
    rc, report, table = run_suite(tmp_path, CUDA_FACTS, "--require-gpu",
                                  "--checks", "cuda,cudnn_conv")
    checks = by_name(report)
    assert rc == 1 and report["status"] == FAIL and report["require_gpu"] is True
    assert checks["cuda"]["status"] == FAIL and checks["cuda"]["original_status"] == SKIP
    assert checks["cudnn_conv"]["status"] == FAIL
    assert checks["cudnn_conv"]["original_status"] == SUBSTITUTED
    assert "--require-gpu" in checks["cudnn_conv"]["message"]
    assert "was substituted" in table
    validate(report)


@needs_torch
def test_env_mismatch_fails_with_both_values(tmp_path: Path) -> None:
    # A lock's JSON shape (facts nested) works as --facts too.
    facts = {"facts": {**CPU_FACTS, "torch": "2.99.0", "python": "3.10"}, "format": 1}
    rc, report, _ = run_suite(tmp_path, facts, "--checks", "env")
    env = by_name(report)["env"]
    assert rc == 1 and env["status"] == FAIL
    assert "torch: image promises 2.99.0, found 2.13.0+cpu" in env["message"]
    assert "python: image promises 3.10, found 3.11" in env["message"]
    validate(report)


@needs_torch
def test_hang_is_killed_and_reported(tmp_path: Path) -> None:
    start = time.monotonic()
    rc, report, _ = run_suite(tmp_path, CPU_FACTS, "--checks", "env,cuda",
                              "--timeout-scale", "0.02", env={"SMOKE_TEST_HANG": "env"})
    env, cuda = by_name(report)["env"], by_name(report)["cuda"]
    assert rc == 1 and env["status"] == ERROR
    assert "timed out after 2 s" in env["message"]
    assert "SMOKE_TEST_HANG" in env["output_tail"]
    assert cuda["status"] == SKIP  # later checks still ran
    assert time.monotonic() - start < 30
    assert not _grandchildren_alive(), "the hung check's grandchild survived the timeout"
    validate(report)


def _grandchildren_alive() -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"smoke-test-hang-grandchild" in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


@needs_torch
def test_crash_becomes_error(tmp_path: Path) -> None:
    rc, report, _ = run_suite(tmp_path, CPU_FACTS, "--checks", "cudnn_conv,cuda",
                              env={"SMOKE_TEST_CRASH": "cudnn_conv"})
    conv = by_name(report)["cudnn_conv"]
    assert rc == 1 and conv["status"] == ERROR
    assert "SIGABRT" in conv["message"]
    assert "SMOKE_TEST_CRASH" in conv["output_tail"]
    assert by_name(report)["cuda"]["status"] == SKIP
    validate(report)


@needs_torch
def test_torch_import_failure_becomes_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ImportError('libcudnn.so.9: cannot open shared object file')\n")
    rc, report, _ = run_suite(tmp_path, CPU_FACTS, "--checks", "cudnn_conv",
                              env={"PYTHONPATH": str(tmp_path / "fake")})
    conv = by_name(report)["cudnn_conv"]
    assert rc == 1 and conv["status"] == ERROR
    assert "libcudnn.so.9" in conv["message"]
    validate(report)


@needs_torch
def test_compile_is_skipped_on_slim_and_says_why(tmp_path: Path) -> None:
    facts = {**CPU_FACTS, "flavor": "slim", "triton": None,
             "dropped": ["triton", "compilers", "headers"]}
    rc, report, _ = run_suite(tmp_path, facts, "--checks", "compile")
    check = by_name(report)["compile"]
    assert rc == 0 and check["status"] == SKIP
    assert "compiler-free (compilers and triton dropped)" in check["message"]
    validate(report)


@needs_torch
def test_cuda_libs_is_skipped_on_a_cpu_torch(tmp_path: Path) -> None:
    rc, report, _ = run_suite(tmp_path, CPU_FACTS, "--checks", "cuda_libs")
    check = by_name(report)["cuda_libs"]
    assert rc == 0 and check["status"] == SKIP and "no CUDA libraries" in check["message"]


def test_without_torch_the_suite_cannot_run(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "smoke", "--json", "--checks", "env"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "has no torch to test" in proc.stderr
    assert proc.stdout == ""


@needs_torch
def test_json_file_and_table_on_stdout(tmp_path: Path) -> None:
    """`torch-smoke --json FILE` from any folder: the table on stdout, the report in FILE."""
    facts = tmp_path / "image.json"
    facts.write_text(json.dumps(CPU_FACTS))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([TORCH_PYTHON, "-m", "smoke", "--json", "out/report.json", "--facts",
                           str(facts), "--checks", "env,cuda"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "overall: PASS" in proc.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [c["name"] for c in report["checks"]] == ["env", "cuda"]
    validate(report)


def test_summarize_keeps_the_error_line() -> None:
    exc = RuntimeError("C++ compile error\n\nCommand:\ng++ x.cpp\n"
                       "x.cpp:38:10: fatal error: Python.h: No such file or directory\n")
    assert summarize(exc) == ("RuntimeError: C++ compile error — x.cpp:38:10: fatal error: "
                              "Python.h: No such file or directory")


def test_unknown_check_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "smoke", "--checks", "nope"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown check(s) nope" in proc.stderr


# ---- pure functions --------------------------------------------------------------------------


@pytest.mark.parametrize(("driver", "minimum", "cuda", "problem"), [
    ("535.104.05", "550.54.14", "12.4",
     "driver 535.104.05 is older than 550.54.14 needed by CUDA 12.4: upgrade the driver or use "
     "an image built for an older CUDA"),
    ("550.54.14", "550.54.14", "12.4", None),
    ("570.26", "550.54.14", "12.4", None),
    ("580.65.6", "580.65.06", "13.0", None),  # numeric, not string, comparison
    ("575.51.03", "580.65.06", "13.2", "older than 580.65.06 needed by CUDA 13.2"),
    ("1000.0", "580.65.06", "13.0", None),
    (None, "580.65.06", "13.0", None),  # no GPU: nothing to compare
    ("535.104.05", None, None, None),
])
def test_driver_problem(
    driver: str | None, minimum: str | None, cuda: str | None, problem: str | None,
) -> None:
    found = driver_problem(driver, minimum, cuda)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_minimum_driver_fallback() -> None:
    assert minimum_driver("12.4") == "550.54.14"
    assert minimum_driver("12.5") == "555.42.02"
    assert minimum_driver("12.7") == "525.60.13"  # minor-version compatibility floor
    assert minimum_driver("13.2") == "580.65.06"
    assert minimum_driver(None) is None


def test_cuda_arch_list_from_the_wheels_flags() -> None:
    assert cuda_arch_list("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120") == \
        "7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert cuda_arch_list("sm_90a compute_90") == "9.0a;9.0+PTX"
    assert cuda_arch_list("compute_80") == "8.0+PTX"
    assert cuda_arch_list(None) == "" and cuda_arch_list("") == ""


def test_wheel_versions_against_the_lock() -> None:
    lock = {"nvidia-cudnn-cu13": "9.26.0.51", "nvidia-nccl-cu13": "2.30.7"}
    assert wheel_mismatches(lock, {"nvidia_cudnn_cu13": "9.26.0.51",
                                   "nvidia-nccl-cu13": "2.30.7", "numpy": "2.4.6"}) == []
    assert wheel_mismatches(lock, {"nvidia-cudnn-cu13": "9.27.0.1",
                                   "nvidia-cufft": "12.0.0"}) == [
        "nvidia-cudnn-cu13: lock pins 9.26.0.51, installed 9.27.0.1",
        "nvidia-cufft: lock pins nothing, installed 12.0.0",
        "nvidia-nccl-cu13: lock pins 2.30.7, installed nothing",
    ]
    assert runtime_matches_wheel("9.26.0", "9.26.0.51")
    assert runtime_matches_wheel("2.30.7", "2.30.7")
    assert not runtime_matches_wheel("9.2.0", "9.26.0.51")
    assert not runtime_matches_wheel("9.26.0", None)


def test_version_formats() -> None:
    assert cudnn_version_str(92600) == "9.26.0"
    assert cudnn_version_str(91002) == "9.10.2"
    assert cudnn_version_str(8902) == "8.9.2"
    assert nccl_version_str((2, 30, 7)) == "2.30.7"
    assert nccl_version_str(21903) == "2.19.3"
    assert nccl_version_str(2708) == "2.7.8"
    assert torch_matches("2.15.0", "2.15.0+cu132")
    assert not torch_matches("2.13.0+cpu", "2.13.0")
    assert not torch_matches("2.15.0", "2.15.1")


def test_arch_supported() -> None:
    arch = ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"]
    assert arch_supported((8, 6), arch)  # sm_80 cubins run on 8.6
    assert arch_supported((10, 0), arch)
    assert not arch_supported((7, 5), arch)
    assert arch_supported((12, 1), arch)
    assert arch_supported((9, 0), ["sm_90a"])
    assert not arch_supported((9, 1), ["sm_90a"])
    assert arch_supported((13, 0), ["compute_120"])  # PTX JIT-compiles for newer GPUs


def test_env_mismatches_rules() -> None:
    actual = {"torch": "2.15.0+cu132", "python": "3.11", "cuda": "13.2", "cudnn": "9.26.1",
              "nccl": "2.30.7", "triton": None}
    promised = {**CUDA_FACTS, "flavor": "slim", "triton": None, "dropped": ["triton"]}
    assert mismatches(promised, actual) == []
    assert mismatches({"cuda": None}, actual) == ["cuda: image promises none, found 13.2"]
    assert mismatches({"nccl": "2.30.8"}, actual) == [
        "nccl: image promises 2.30.8, found 2.30.7"]
    assert mismatches({}, actual) == []  # missing keys are not checked


def test_load_facts_accepts_lock_shape_and_labels(tmp_path: Path) -> None:
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"facts": {"torch": "2.15.0", "min-driver": "580.65.06",
                                          "cudnn": "", "dropped": "triton,headers"}}))
    facts = load_facts(lock)
    assert facts == {"torch": "2.15.0", "min_driver": "580.65.06", "cudnn": None,
                     "dropped": ["triton", "headers"]}


def test_require_gpu_policy_and_overall() -> None:
    degraded = {"name": "nccl_allreduce", "status": "degraded", "message": "1 GPU",
                "metrics": {}, "duration_s": 1.0}
    failed = apply_require_gpu(degraded)
    assert failed["status"] == FAIL and failed["original_status"] == "degraded"
    skipped_compile = {"name": "compile", "status": SKIP, "message": "slim", "metrics": {},
                       "duration_s": 0.0}
    assert apply_require_gpu(skipped_compile) is skipped_compile
    assert overall([skipped_compile, degraded]) == PASS
    assert overall([skipped_compile, failed]) == FAIL


def test_interpret_missing_result(tmp_path: Path) -> None:
    check = interpret("amp_train", -11, False, 300.0, tmp_path / "none.json",
                      "Fatal Python error: Segmentation fault")
    assert check["status"] == ERROR and "SIGSEGV" in check["message"]
    assert "Segmentation fault" in check["output_tail"]
