"""The first run on a real GPU node, with fake device lists, fake nvidia-smi/NVML outputs and a
fake `torch` module: one GPU, eight GPUs, MIG, hidden GPUs, CUDA failing to start with devices
present, NVML hanging, /dev/shm too small, an R580 driver against a CUDA 13.2 image.

No GPU was available to write these against: the fakes reproduce what torch, NCCL, nvidia-smi,
NVML and the NVIDIA container runtime print, as documented.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.core import engine, labels
from builder.model import gpuhost, lockfile, matrix, smokereport
from builder.stages import render
from builder.stages import smoketest as bsmoke
from smoke import DEGRADED, ERROR, FAIL, PASS, SKIP, runner
from smoke import host as smoke_host
from smoke.checks import common, cuda, gpu_checks_not_run, libs, nccl, ran_fully_on_gpu
from smoke.nvml import cuda_version_str
from smoke.versions import (
    MIN_DRIVER,
    driver_cuda,
    driver_problem,
    numeric,
    nvidia_require_cuda,
)

ROOT = Path(__file__).resolve().parents[3]
H200 = "NVIDIA H200"
R580 = "580.95.05"


# ---- fakes ----------------------------------------------------------------------------------


def requirement_met(require: str, cuda: str, driver: str) -> bool:
    """libnvidia-container's side, faked: whether a driver (its version and the CUDA it
    reports) meets an `NVIDIA_REQUIRE_CUDA` expression of `cuda>=` / `driver>=` terms."""
    have = {"cuda": numeric(cuda), "driver": numeric(driver)}

    def term_ok(term: str) -> bool:
        key, _, want = term.partition(">=")
        return key in have and have[key] >= numeric(want)

    return any(all(term_ok(t) for t in alt.split(",")) for alt in require.split())


class FakeCuda:
    """torch.cuda as a node with these devices shows it (or, with `init_error`, a node whose
    CUDA cannot start)."""

    def __init__(self, names: list[str], init_error: str | None = None) -> None:
        self.names, self.init_error = names, init_error

    def is_available(self) -> bool:
        return self.init_error is None and bool(self.names)

    def device_count(self) -> int:
        return len(self.names) if self.is_available() else 0

    def get_device_name(self, index: int) -> str:
        return self.names[index]

    def get_device_properties(self, index: int) -> Any:
        return SimpleNamespace(name=self.names[index], major=9, minor=0,
                               total_memory=80 * 2**30)

    def init(self) -> None:
        if self.init_error:
            raise RuntimeError(self.init_error)


def fake_node(monkeypatch: pytest.MonkeyPatch, names: list[str], *, nodes: int | None = None,
              init_error: str | None = None) -> None:
    """A CUDA torch seeing `names`, on a container given `nodes` /dev/nvidiaN (default: one
    per name)."""
    torch = SimpleNamespace(__version__="2.15.0", version=SimpleNamespace(cuda="13.2"),
                            cuda=FakeCuda(names, init_error))
    monkeypatch.setitem(sys.modules, "torch", torch)
    count = len(names) if nodes is None else nodes
    monkeypatch.setattr(common, "_dev_nvidia", lambda: [
        "/dev/nvidiactl", "/dev/nvidia-uvm", *(f"/dev/nvidia{i}" for i in range(count))])


def ctx(gpus: list[dict[str, Any]], *, shm: int = 8 << 30, visible: str | None = None
        ) -> dict[str, Any]:
    return {"facts": {"accelerator": "cuda", "cuda": "13.2", "min_driver": "580.65.06"},
            "host": {"gpus": gpus, "driver": R580, "driver_cuda": "13.0", "shm_bytes": shm,
                     "nvidia_devices": [f"/dev/nvidia{i}" for i in range(len(gpus))],
                     "cuda_visible_devices": visible}}


def smi_gpus(n: int, name: str = H200, mig: bool = False) -> list[dict[str, Any]]:
    return [{"index": i, "name": name, "capability": "9.0", "memory": 143771, "mig": mig}
            for i in range(n)]


def fake_all_reduce(monkeypatch: pytest.MonkeyPatch, busbw: float | None = None,
                    log: str = "", raises: Exception | None = None) -> list[int]:
    """nccl.all_reduce answering like a run over `world` ranks; returns the worlds asked for."""
    asked: list[int] = []

    def all_reduce(backend: str, world: int, numel: int) -> dict[str, Any]:
        asked.append(world)
        if raises:
            raise raises
        metrics = {"world_size": world, "backend": backend, "exact": True}
        if world > 1:
            bw = busbw if busbw is not None else 5.0
            metrics |= {"busbw_gbps": bw, "algbw_gbps": bw * world / (2 * (world - 1)),
                        "time_us": 100.0, "bytes": numel * 4}
        return metrics

    monkeypatch.setattr(nccl, "all_reduce", all_reduce)
    monkeypatch.setattr(nccl, "nccl_log_text", lambda: log)
    return asked


def checks_report(statuses: dict[str, str], *, require_gpu: bool = True) -> dict[str, Any]:
    checks = [{"name": n, "status": s, "duration_s": 1.0, "message": f"{n} {s}", "metrics": {}}
              for n, s in statuses.items()]
    if require_gpu:
        checks = [runner.apply_require_gpu(c) for c in checks]
    return {
        "schema_version": 1, "image": {"ref": "r/torch:x", "id": None, "digest": None},
        "facts": {"accelerator": "cuda"}, "host": {}, "require_gpu": require_gpu,
        "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00",
        "status": runner.overall(checks), "checks": checks,
    }


GPU_OK = {"env": PASS, "cuda": PASS, "cudnn_conv": PASS, "amp_train": PASS}


# ---- one GPU, eight GPUs, MIG, hidden GPUs ---------------------------------------------------


def test_one_gpu_passes_nccl_as_a_single_rank_and_the_gate(monkeypatch):
    fake_node(monkeypatch, [H200])
    asked = fake_all_reduce(monkeypatch)
    check = nccl.run(ctx(smi_gpus(1), shm=64 << 20))  # one rank needs no shared memory
    assert asked == [1]
    assert check["status"] == PASS and "single rank" in check["message"]
    assert "busbw_gbps" not in check["metrics"] and "GB/s" not in check["message"]
    named = {"name": "nccl_allreduce", **check}
    assert ran_fully_on_gpu(named) and runner.apply_require_gpu(named)["status"] == PASS
    report = checks_report({**GPU_OK, "nccl_allreduce": check["status"]})
    assert report["status"] == "pass"
    assert smokereport.report_passed(report, require_gpu=True) == (
        True, "smoke passed (5 checks, with --require-gpu)")


def test_eight_gpus_report_bandwidth_transport_and_floor(monkeypatch):
    fake_node(monkeypatch, [H200] * 8)
    log = ("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "NCCL INFO Connected NVLS comm\n")
    fake_all_reduce(monkeypatch, busbw=352.1, log=log)
    check = nccl.run(ctx(smi_gpus(8)))
    assert check["status"] == PASS, check["message"]
    assert check["metrics"]["world_size"] == 8 and check["metrics"]["transports"] == [
        "NVLS", "P2P"]
    assert check["metrics"]["busbw_floor_gbps"] == 100.0
    assert "busbw 352.10 GB/s via NVLS+P2P (floor 100 GB/s)" in check["message"]


def test_eight_gpus_with_nvlink_down_fail_below_the_floor(monkeypatch):
    fake_node(monkeypatch, [H200] * 8)
    fake_all_reduce(monkeypatch, busbw=11.5, log="NCCL INFO Channel 00 : 0[0] -> 1[1] via "
                    "SHM/direct/direct\n")
    check = nccl.run(ctx(smi_gpus(8)))
    assert check["status"] == FAIL
    assert "below the 100 GB/s floor of NVIDIA H200" in check["message"]
    assert "via SHM" in check["message"]
    assert not ran_fully_on_gpu({"name": "nccl_allreduce", **check})


def test_busbw_floors_by_family():
    assert nccl.floor_for("NVIDIA GH200 480GB") == 40.0  # not H200's
    assert nccl.floor_for("NVIDIA H100 PCIe") == 3.0  # not H100 SXM's
    assert nccl.floor_for("NVIDIA H20") == 100.0
    assert nccl.floor_for("NVIDIA A100-SXM4-80GB") == 60.0
    assert nccl.floor_for("Tesla T4") == nccl.DEFAULT_FLOOR
    assert nccl.transports("x via NET/IB/0\ny via P2P/IPC\n") == ["NET/IB", "P2P"]


def test_mig_slice_passes_as_a_single_rank(monkeypatch):
    slice_name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    fake_node(monkeypatch, [slice_name], nodes=1)
    fake_all_reduce(monkeypatch)
    mig_gpus = smi_gpus(2, "NVIDIA H100 80GB HBM3", mig=True)  # two MIG GPUs, one slice used
    check = nccl.run(ctx(mig_gpus))
    assert check["status"] == PASS and "MIG slice" in check["message"]
    info = cuda.device_info(0)
    assert info == {"index": 0, "name": slice_name, "capability": "9.0", "memory": 81920,
                    "mig": True}


def test_nvidia_smi_and_nvml_outputs_with_mig():
    fields = smoke_host.SMI_FIELDS[0]
    out = ("0, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.95.05, Enabled\n"
           "1, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.95.05, Disabled\n")
    gpus, driver = smoke_host.parse_smi(fields, out)
    assert driver == R580 and [g["mig"] for g in gpus] == [True, False]
    assert gpus[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
                       "memory": 81559, "mig": True}
    old, _ = smoke_host.parse_smi(smoke_host.SMI_FIELDS[1], "0, Tesla V100-SXM2-16GB, 16160, "
                                  "470.57.02\n")
    assert old[0]["capability"] is None and old[0]["memory"] == 16160
    assert cuda_version_str(13000) == "13.0" and cuda_version_str(12080) == "12.8"


def test_hidden_gpus_are_degraded_and_fail_require_gpu_and_the_gate(monkeypatch):
    fake_node(monkeypatch, [H200], nodes=8)
    fake_all_reduce(monkeypatch)
    check = nccl.run(ctx(smi_gpus(8), visible="3"))
    assert check["status"] == DEGRADED
    assert "8 GPUs are on this node but CUDA sees 1 (CUDA_VISIBLE_DEVICES='3')" in check[
        "message"]
    failed = runner.apply_require_gpu({"name": "nccl_allreduce", **check})
    assert failed["status"] == FAIL and failed["original_status"] == DEGRADED
    report = checks_report({**GPU_OK, "nccl_allreduce": DEGRADED})
    passed, why = smokereport.report_passed(report, require_gpu=True)
    assert not passed and "nccl_allreduce" in why
    # The same rule without --require-gpu: degraded is ok, but it is not a full GPU run.
    soft = checks_report({**GPU_OK, "nccl_allreduce": DEGRADED}, require_gpu=False)
    assert soft["status"] == "pass" and gpu_checks_not_run(soft["checks"]) == ["nccl_allreduce"]


def test_cuda_devices_are_what_the_report_records():
    checks = [{"name": "cuda", "status": PASS, "metrics": {"devices": [
        {"index": 0, "name": H200, "capability": "9.0", "memory": 143771, "mig": False,
         "matmul_rel_err": 1e-7}]}}]
    assert runner.cuda_devices(checks) == [{"index": 0, "name": H200, "capability": "9.0",
                                            "memory": 143771, "mig": False}]
    host = {"cuda_devices": runner.cuda_devices(checks) * 8, "gpus": smi_gpus(8),
            "driver": R580, "driver_cuda": "13.0"}
    assert smoke_host.host_summary(host) == (
        "CUDA used 8 × NVIDIA H200 (sm 9.0, 140 GiB), driver 580.95.05 (CUDA 13.0)")
    assert smoke_host.host_summary({"gpus": [], "cuda_devices": []}) == (
        "no GPU used (no NVIDIA GPU visible)")
    assert smoke_host.host_summary({"gpus": smi_gpus(2), "cuda_devices": [], "driver": R580}
                                   ).startswith("no GPU used by CUDA although the driver lists")


# ---- CUDA failing to start with devices present --------------------------------------------


FABRIC = ("CUDA driver initialization failed, you might not have a CUDA gpu. Error 802: system "
          "not yet initialized")


def test_cuda_that_cannot_start_on_a_gpu_node_fails_with_the_fabric_manager_hint(monkeypatch):
    fake_node(monkeypatch, [H200] * 8, init_error=FABRIC)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check = cuda.run(ctx(smi_gpus(8)))
    assert check["status"] == FAIL and "fabric manager" in check["message"]
    assert "nvidia-fabricmanager" in check["message"]
    # The CPU stand-ins of the other GPU checks fail too: a broken node never passes.
    status, message = common.stand_in_status(ctx(smi_gpus(8)), "CPU conv")
    assert status == FAIL and "GPUs present but unusable" in message
    asked = fake_all_reduce(monkeypatch)
    assert nccl.run(ctx(smi_gpus(8)))["status"] == FAIL and asked == [nccl.CPU_WORLD]


def test_an_empty_cuda_visible_devices_is_named(monkeypatch):
    fake_node(monkeypatch, [H200], init_error="CUDA error: no CUDA-capable device is detected")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    check = cuda.run(ctx(smi_gpus(1), visible=""))
    assert check["status"] == FAIL
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU" in check["message"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "check the driver" in common.cuda_init_hint("CUDA error: unknown error")


def test_without_device_nodes_a_cuda_image_still_skips(monkeypatch):
    fake_node(monkeypatch, [], nodes=0)
    check = cuda.run(ctx([]))
    assert check["status"] == SKIP and "/dev/nvidia* is absent" in check["message"]
    assert common.stand_in_status(ctx([]), "CPU conv")[0] == "substituted"


# ---- NVML hanging ---------------------------------------------------------------------------


def test_hanging_nvidia_smi_and_nvml_cost_seconds_not_the_report(monkeypatch):
    calls: list[list[str]] = []

    def hang(cmd: list[str], timeout: float = smoke_host.PROBE_TIMEOUT_S) -> tuple[int, str]:
        calls.append(cmd)
        raise smoke_host.TimedOut(f"`{cmd[0]}` did not answer within {timeout:.0f} s")

    monkeypatch.setattr(smoke_host, "run_bounded", hang)
    facts = smoke_host.gpu_facts()
    assert facts["gpus"] == [] and facts["driver"] is None
    assert len(facts["probe_problems"]) == 2 and "NVML" in facts["probe_problems"][1]
    assert len(calls) == 2  # nvidia-smi is not asked again without its newer fields


def test_nvml_answers_where_nvidia_smi_is_missing(monkeypatch):
    nvml_json = ('{"driver": "580.95.05", "driver_cuda": "13.0", "gpus": [{"index": 0, '
                 '"name": "NVIDIA GH200 480GB", "capability": "9.0", "memory": 97871, '
                 '"mig": false}]}')

    def run(cmd: list[str], timeout: float = 30) -> tuple[int, str]:
        if cmd[0] == "nvidia-smi":
            raise FileNotFoundError("nvidia-smi")
        return 0, nvml_json + "\n"

    monkeypatch.setattr(smoke_host, "run_bounded", run)
    facts = smoke_host.gpu_facts()
    assert (facts["driver"], facts["driver_cuda"]) == (R580, "13.0")
    assert facts["gpus"][0]["name"] == "NVIDIA GH200 480GB" and facts["probe_problems"] == []


class StuckProcess:
    """A check process in the driver (state D): it ignores SIGKILL and never exits."""

    pid = 999_999_999

    def wait(self, timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired("python -m smoke.check cuda", timeout or 0)


def test_a_check_stuck_in_the_driver_gives_an_error_instead_of_a_hang(monkeypatch, tmp_path):
    killed: list[int] = []
    monkeypatch.setattr(runner, "kill_group", killed.append)
    rc, timed_out = runner.wait_bounded(StuckProcess(), 300)  # type: ignore[arg-type]
    assert (rc, timed_out) == (None, True) and killed == [StuckProcess.pid]
    check = runner.interpret("cuda", rc, timed_out, 300, tmp_path / "none.json", "")
    assert check["status"] == ERROR
    assert "did not exit 30 s after SIGKILL (stuck in the GPU driver" in check["message"]


# ---- /dev/shm too small ---------------------------------------------------------------------


def test_small_shm_fails_before_nccl_starts(monkeypatch):
    fake_node(monkeypatch, [H200] * 8)
    asked = fake_all_reduce(monkeypatch, busbw=350.0)
    check = nccl.run(ctx(smi_gpus(8), shm=64 << 20))
    assert asked == []  # NCCL was not started
    assert check["status"] == FAIL
    assert check["message"].startswith("/dev/shm is 64 MiB, NCCL needs 4 GiB for 8 ranks")
    assert "--shm-size=8g" in check["message"]
    assert nccl.shm_problem(ctx(smi_gpus(2), shm=1 << 30), 2) is None


def test_a_rank_that_dies_keeps_the_shm_hint(monkeypatch):
    fake_node(monkeypatch, [H200] * 2)
    # Enough for the pre-check, under the 1 GiB warning: what `--shm-size=1000m` gives.
    error = RuntimeError("ProcessRaisedException: -- Process 1 terminated with the following "
                         "error: ncclUnhandledCudaError / unhandled system error")
    fake_all_reduce(monkeypatch, raises=error)
    monkeypatch.setattr(nccl, "shm_needed", lambda world: 512 << 20)
    check = nccl.run(ctx(smi_gpus(2), shm=1000 << 20))
    assert check["status"] == FAIL
    assert "NCCL all-reduce over 2 GPU(s) failed: RuntimeError" in check["message"]
    assert "/dev/shm is only 1000 MiB" in check["message"]


# ---- an R580 driver against a CUDA 13.2 image -----------------------------------------------


REFUSAL = ("docker: Error response from daemon: failed to create task for container: "
           "failed to create shim task: OCI runtime create failed: runc create failed: "
           "unable to start container process: error during container init: error running "
           "hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode "
           "as 'legacy'\nnvidia-container-cli: requirement error: unsatisfied condition: "
           "cuda>=13.2, please update your driver to a newer version, or use an earlier cuda "
           "container: unknown.\n")


def test_r580_starts_a_cuda_13_2_image():
    require = nvidia_require_cuda("580.65.06")  # the CUDA 13.2 images' min-driver
    assert require == "cuda>=13.0"
    assert driver_cuda(R580) == "13.0"
    assert requirement_met(require, "13.0", R580)  # the runtime starts it on R580
    assert not requirement_met("cuda>=13.2", "13.0", R580)  # what images asked before
    assert not requirement_met(require, "12.9", "575.51.03")
    assert driver_problem(R580, "580.65.06", "13.2") is None  # and the env check agrees
    assert nvidia_require_cuda("570.26") == "cuda>=12.8"
    assert nvidia_require_cuda("580.95.05") == "cuda>=13.0,driver>=580.95.05"
    assert requirement_met("cuda>=13.0,driver>=580.95.05", "13.0", R580)
    assert not requirement_met("cuda>=13.0,driver>=580.95.05", "13.0", "580.65.06")


def test_the_runtime_refusal_names_both_drivers():
    image_labels = {labels.MIN_DRIVER: "580.65.06"}
    old_image = gpuhost.requirement_error(REFUSAL, image_labels, R580)
    assert old_image is not None
    assert "the node has driver 580.95.05 (CUDA 13.0)" in old_image
    assert "requires cuda>=13.2 (NVIDIA_REQUIRE_CUDA)" in old_image
    assert "min-driver 580.65.06" in old_image and "rebuild the image" in old_image
    too_old = gpuhost.requirement_error(REFUSAL, image_labels, "575.51.03")
    assert too_old and "upgrade the driver to at least 580.65.06" in too_old
    remote = gpuhost.requirement_error(REFUSAL, image_labels, None)
    assert remote and "run nvidia-smi on the node" in remote
    assert gpuhost.requirement_error("exec format error", image_labels, R580) is None


def test_builder_smoke_reports_the_refusal(monkeypatch, tmp_path):
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(engine, "ensure_engine", lambda: {"Runtimes": {"nvidia": {}}})
    info = {"Id": "sha256:" + "ab" * 32, "RepoDigests": [], "Architecture": "amd64", "Os": "linux",
            "Config": {"Labels": {labels.ACCELERATOR: "cuda", labels.MIN_DRIVER: "580.65.06"}}}
    monkeypatch.setattr(engine, "inspect_image", lambda ref: info)
    monkeypatch.setattr(gpuhost, "local_driver", lambda: R580)

    def docker(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 125 if args[0] == "run" else 0, "",
                                           REFUSAL if args[0] == "run" else "")

    monkeypatch.setattr(engine, "docker", docker)
    report = bsmoke.run_smoke("r/torch:cuda", require_gpu=True, gpus=None, report_path=None)
    [only] = report["checks"]
    assert only["status"] == "error"
    assert "the node has driver 580.95.05 (CUDA 13.0)" in only["message"]
    assert report["runner"]["gpus"] == {"flags": ["--gpus", "all"],
                                        "source": "the engine has the nvidia runtime"}


def test_nvidia_require_cuda_agrees_with_the_min_driver_label_for_every_variant(
        shipped: matrix.Matrix) -> None:
    """Every variant of the shipped matrix: a node at exactly the min-driver label starts the
    image; a driver of the previous CUDA does not; CPU images carry neither."""
    checked = 0
    for variant in shipped.select([]):
        lock = lockfile.require_lock(ROOT / "locks", variant)
        out = render.render(shipped, variant, lock, lockfile.read_base_lock(ROOT / "locks", variant))
        label = re.search(r'io\.torch-images\.min-driver="([^"]*)"', out.dockerfile)
        require = re.search(r'NVIDIA_REQUIRE_CUDA="([^"]*)"', out.dockerfile)
        assert label, variant.key
        if variant.accelerator == "cpu":
            assert label.group(1) == "" and require is None, variant.key
            continue
        min_driver = label.group(1)
        assert require, variant.key
        assert requirement_met(require.group(1), driver_cuda(min_driver) or "", min_driver), (
            variant.key, require.group(1), min_driver)
        older = [d for d in MIN_DRIVER.values() if numeric(d) < numeric(min_driver)]
        below = max(older, key=numeric)
        assert not requirement_met(require.group(1), driver_cuda(below) or "", below), (
            variant.key, require.group(1), below)
        checked += 1
    assert checked >= 20  # every CUDA variant, amd64 and arm64


# ---- the engine is asked for GPUs, not the client ----------------------------------------------


def test_gpu_detection_asks_the_engine(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert gpuhost.engine_gpu_flags({"Runtimes": {"runc": {}, "nvidia": {}}},
                                    lambda: False)[0] == ["--gpus", "all"]
    cdi = {"DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}
    assert gpuhost.engine_gpu_flags(cdi, lambda: False)[0] == ["--device", "nvidia.com/gpu=all"]
    assert gpuhost.engine_gpu_flags({}, lambda: True)[0] == ["--gpus", "all"]
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-node:2376")
    flags, why = gpuhost.engine_gpu_flags({"Runtimes": {"runc": {}}}, lambda: True)
    assert flags == [] and "tcp://gpu-node:2376" in why and "--gpus" in why
    assert gpuhost.engine_gpu_flags({"Runtimes": {"nvidia": {}}}, lambda: False)[0] == [
        "--gpus", "all"]


def test_loaded_nccl_is_found_in_the_process_maps():
    maps = ("7f00-7f01 r-xp 0 08:01 1 /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/"
            "libnccl.so.2\n7f02-7f03 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert libs.loaded_path(maps, "libnccl.so").endswith("nvidia/nccl/lib/libnccl.so.2")
    assert libs.loaded_path(maps, "libcudnn") is None
    problems = libs.library_problems(
        {"cudnn_runtime": "9.26.0", "cudnn_compiled": "9.26.0", "nccl_runtime": "2.21.5",
         "nccl_compiled": "2.30.7"}, {"nvidia-cudnn-cu13": "9.26.0.51", "nvidia-nccl-cu13":
                                      "2.30.7"})
    assert problems == ["nccl: torch loads 2.21.5, the nvidia-nccl wheel is 2.30.7"]


def test_a_report_with_the_new_host_fields_matches_the_schema():
    host = {**ctx(smi_gpus(1, mig=True))["host"], "probe_problems": ["NVML: hung"],
            "cuda_devices": [{"index": 0, "name": H200, "capability": "9.0", "memory": 1,
                              "mig": True}]}
    report = {**checks_report({**GPU_OK, "nccl_allreduce": PASS}), "host": host}
    assert smokereport.validation_error(report) is None


def test_a_stopped_suite_still_writes_its_report(monkeypatch, tmp_path):
    """SIGTERM (docker stop, an outer timeout) in the middle: the report of what ran, exit 143."""
    monkeypatch.setattr(runner, "cannot_run", lambda python: None)
    monkeypatch.setattr(runner, "host_facts", lambda: {"gpus": [], "shm_bytes": 1 << 30})
    monkeypatch.setattr(runner, "DEFAULT_FACTS", tmp_path / "absent.json")

    def run_check(name: str, python: str, ctx: dict[str, Any], timeout: float) -> dict[str, Any]:
        if name == "cuda":
            runner._stop(15, None)
        return {"name": name, "status": PASS, "message": "ok", "metrics": {}, "duration_s": 1.0}

    monkeypatch.setattr(runner, "run_check", run_check)
    out = tmp_path / "report.json"
    rc = runner.main(["--checks", "env,cuda,nccl_allreduce", "--json", str(out)])
    assert rc == 143
    report = json.loads(out.read_text())
    assert [c["name"] for c in report["checks"]] == ["env", "suite"]
    assert report["checks"][1]["message"] == "stopped by SIGTERM before cuda, nccl_allreduce ran"
    assert report["status"] == "fail" and smokereport.validation_error(report) is None
