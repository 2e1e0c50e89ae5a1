"""`builder.stages.smoketest`: the publish gate (`report_passed`) and `run_smoke` with a faked engine.

Nothing here touches Docker: `builder.core.engine`'s calls are replaced by fakes.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from builder.commands import smoke as smoke_cmd
from builder.core import engine, labels
from builder.core.errors import CommandFailed, EngineError
from builder.model import gpuhost, platforms, smokereport
from builder.stages import smoketest as bsmoke

IMAGE_ID = "sha256:" + "c0ffee" * 10 + "abcd"
SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "smoke" /
                     "report.schema.json").read_text())


def check(name: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "duration_s": 1.0, "message": f"{name} {status}",
            "metrics": {}, **extra}


def report(accelerator: str = "cpu", *, require_gpu: bool = False,
           statuses: dict[str, str] | None = None) -> dict[str, Any]:
    statuses = statuses or {"env": "pass", "cuda": "skip", "cudnn_conv": "pass",
                            "nccl_allreduce": "pass", "amp_train": "pass"}
    return {
        "schema_version": 1,
        "image": {"ref": "local/torch:x", "id": IMAGE_ID, "digest": None},
        "facts": {"accelerator": accelerator, "torch": "2.15.0", "python": "3.11"},
        "host": {"gpus": [], "driver": None, "shm_bytes": 8 << 30},
        "require_gpu": require_gpu,
        "started": "2026-01-01T00:00:00+00:00",
        "finished": "2026-01-01T00:01:00+00:00",
        "status": "pass" if all(s not in ("fail", "error") for s in statuses.values()) else "fail",
        "checks": [check(n, s) for n, s in statuses.items()],
    }


GPU_PASS = {"env": "pass", "cuda": "pass", "cudnn_conv": "pass", "nccl_allreduce": "pass",
            "amp_train": "pass"}
CPU_HOST = {"env": "pass", "cuda": "skip", "cudnn_conv": "substituted",
            "nccl_allreduce": "substituted", "amp_train": "substituted"}


# ---- report_passed --------------------------------------------------------------------------


def test_no_report_does_not_pass() -> None:
    passed, reason = smokereport.report_passed(None, require_gpu=False)
    assert not passed and "builder smoke" in reason


def test_cpu_image_passes_even_when_gpu_demanded() -> None:
    assert smokereport.report_passed(report("cpu"), require_gpu=False)[0]
    assert smokereport.report_passed(report("cpu"), require_gpu=True)[0]


def test_failed_check_is_named() -> None:
    bad = report("cpu", statuses={"env": "fail", "cuda": "skip"})
    passed, reason = smokereport.report_passed(bad, require_gpu=False)
    assert not passed and "env fail: env fail" in reason


def test_cuda_report_from_cpu_host_passes_only_without_require_gpu() -> None:
    cpu_host = report("cuda", statuses=CPU_HOST)
    assert smokereport.report_passed(cpu_host, require_gpu=False)[0]
    passed, reason = smokereport.report_passed(cpu_host, require_gpu=True)
    assert not passed and "without --require-gpu" in reason


def test_cuda_report_with_require_gpu() -> None:
    assert smokereport.report_passed(report("cuda", require_gpu=True, statuses=GPU_PASS),
                                require_gpu=True)[0]
    # Defence in depth: a report claiming --require-gpu yet holding a degraded GPU check.
    odd = report("cuda", require_gpu=True, statuses={**GPU_PASS, "nccl_allreduce": "degraded"})
    passed, reason = smokereport.report_passed(odd, require_gpu=True)
    assert not passed and "nccl_allreduce" in reason


def test_report_without_facts_or_schema_does_not_pass() -> None:
    no_facts = {**report("cpu"), "facts": None}
    assert not smokereport.report_passed(no_facts, require_gpu=False)[0]
    broken = copy.deepcopy(report("cpu"))
    broken["checks"][0]["status"] = "great"
    passed, reason = smokereport.report_passed(broken, require_gpu=False)
    assert not passed and "schema" in reason and "checks/0/status" in reason


# ---- run_smoke with a fake engine ----------------------------------------------------------


class FakeDocker:
    """Records docker calls; `docker run` answers with the given stdout/rc (or raises)."""

    def __init__(self, stdout: str = "", rc: int = 0, stderr: str = "",
                 raises: Exception | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.stdout, self.rc, self.stderr, self.raises = stdout, rc, stderr, raises

    def __call__(self, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        args = tuple(str(a) for a in args)
        self.calls.append(args)
        if args[0] == "run":
            if self.raises:
                raise self.raises
            return subprocess.CompletedProcess(args, self.rc, self.stdout, self.stderr)
        return subprocess.CompletedProcess(args, 0, "", "")

    @property
    def run_args(self) -> tuple[str, ...]:
        return next(c for c in self.calls if c[0] == "run")


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(engine, "ensure_engine", lambda: {})
    monkeypatch.setattr(gpuhost, "local_gpu", lambda: False)
    image_info = {"Id": IMAGE_ID, "RepoDigests": ["reg/torch@sha256:" + "d1" * 32],
                  "Config": {"Labels": {labels.ACCELERATOR: "cuda"}}}
    monkeypatch.setattr(engine, "inspect_image", lambda ref: image_info)
    return image_info


def use_docker(monkeypatch: pytest.MonkeyPatch, fake: FakeDocker) -> FakeDocker:
    monkeypatch.setattr(engine, "docker", fake)
    return fake


def test_garbage_output_becomes_error_report(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    fake = use_docker(monkeypatch, FakeDocker(stdout="Segmentation fault\nnot json {",
                                              rc=139, stderr="python: crashed"))
    out = tmp_path / "out" / "report.json"
    result = bsmoke.run_smoke("local/torch:x", require_gpu=False, gpus=None, report_path=out)
    assert result["status"] == "fail"
    [only] = result["checks"]
    assert only["status"] == "error" and "exited with 139" in only["message"]
    assert "Segmentation fault" in only["output_tail"]
    jsonschema.Draft202012Validator(SCHEMA).validate(result)
    assert bsmoke.load_report(IMAGE_ID) == result
    assert json.loads(out.read_text()) == result
    stored = tmp_path / "state" / "reports" / f"{IMAGE_ID.removeprefix('sha256:')}.json"
    assert stored.is_file()
    assert not smokereport.report_passed(result, require_gpu=False)[0]
    args = fake.run_args
    for flag in ("--rm", "--read-only", "--shm-size=8g", "--image-id"):
        assert flag in args
    assert args[args.index("--network") + 1] == "none"
    assert "--gpus" not in args  # no GPU on this (faked) host


def test_valid_report_is_stored_with_runner(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = report("cuda", require_gpu=True, statuses=GPU_PASS)
    stdout = "entrypoint: hello\n" + json.dumps(good, indent=2)
    monkeypatch.setattr(engine, "ensure_engine", lambda: {"Runtimes": {"nvidia": {}}})
    fake = use_docker(monkeypatch, FakeDocker(stdout=stdout))
    result = bsmoke.run_smoke("local/torch:x", require_gpu=True, gpus=None, report_path=None)
    assert result["checks"] == good["checks"] and result["runner"]["kind"] == "docker"
    assert "--require-gpu" in fake.run_args
    assert fake.run_args[fake.run_args.index("--gpus") + 1] == "all"
    assert smokereport.report_passed(bsmoke.load_report(IMAGE_ID), require_gpu=True)[0]


def test_schema_invalid_report_becomes_error(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_docker(monkeypatch, FakeDocker(stdout=json.dumps({"status": "pass"})))
    result = bsmoke.run_smoke("local/torch:x", require_gpu=False, gpus=None, report_path=None)
    assert result["checks"][0]["status"] == "error"
    assert "does not match its schema" in result["checks"][0]["message"]


def test_timeout_removes_the_container(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = use_docker(monkeypatch, FakeDocker(raises=CommandFailed("`docker run` timed out")))
    result = bsmoke.run_smoke("local/torch:x", require_gpu=False, gpus="0,1", report_path=None)
    assert "timed out" in result["checks"][0]["message"]
    name = fake.run_args[fake.run_args.index("--name") + 1]
    assert ("rm", "-f", name) in fake.calls
    assert fake.run_args[fake.run_args.index("--gpus") + 1] == '"device=0,1"'


def test_cpu_image_does_not_pass_require_gpu_to_the_suite(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_engine["Config"]["Labels"][labels.ACCELERATOR] = "cpu"
    fake = use_docker(monkeypatch, FakeDocker(stdout=json.dumps(report("cpu"))))
    bsmoke.run_smoke("local/torch:cpu", require_gpu=True, gpus=None, report_path=None)
    assert "--require-gpu" not in fake.run_args


def test_missing_image_is_an_engine_error(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine, "inspect_image", lambda ref: None)
    with pytest.raises(EngineError, match="no image"):
        bsmoke.run_smoke("nope", require_gpu=False, gpus=None, report_path=None)


@pytest.mark.parametrize(("gpus", "host_gpu", "expected"), [
    (None, False, []),
    (None, True, ["--gpus", "all"]),
    ("all", False, ["--gpus", "all"]),
    ("none", True, []),
    ("2", False, ["--gpus", "2"]),
    ("1", True, ["--gpus", "1"]),
    ("device=1", True, ["--gpus", "device=1"]),
    ("0,1", True, ["--gpus", '"device=0,1"']),
])
def test_gpu_args(gpus: str | None, host_gpu: bool, expected: list[str]) -> None:
    assert bsmoke.gpu_args(gpus, ["--gpus", "all"] if host_gpu else []) == expected


def test_load_report_absent_and_corrupt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path))
    assert bsmoke.load_report(IMAGE_ID) is None
    path = tmp_path / "reports" / f"{IMAGE_ID.removeprefix('sha256:')}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with pytest.raises(bsmoke.BuilderError, match="not valid JSON"):
        bsmoke.load_report(IMAGE_ID)


# ---- CLI ------------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="builder")
    smoke_cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.mark.parametrize(("statuses", "code"), [(CPU_HOST, 0), ({**CPU_HOST, "env": "fail"}, 1)])
def test_cli_exit_code_and_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    statuses: dict[str, str], code: int,
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(image: str, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs, image=image)
        return report("cuda", statuses=statuses)

    monkeypatch.setattr(smoke_cmd, "run_smoke", fake_run)
    args = _parse(["smoke", "local/torch:x", "--gpus", "0", "--timeout-scale", "2"])
    assert args.func(args) == code
    out = capsys.readouterr().out
    assert "cudnn_conv" in out and "substituted" in out
    assert ("PASS" if code == 0 else "FAIL") in out
    assert seen == {"image": "local/torch:x", "require_gpu": False, "gpus": "0",
                    "report_path": None, "timeout_scale": 2.0}


def test_cli_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(smoke_cmd, "run_smoke", lambda image, **kw: report("cuda", statuses=CPU_HOST))
    args = _parse(["smoke", "img", "--require-gpu", "--json"])
    assert args.func(args) == 1  # a CPU-host report of a CUDA image fails --require-gpu
    assert json.loads(capsys.readouterr().out)["checks"][1]["status"] == "skip"


def test_require_gpu_failures_count_as_stand_ins_when_the_gate_allows_cpu_smoke():
    """A later `--require-gpu` run on a CPU host must not turn an allowed CPU smoke into a fail."""
    from builder.model.smokereport import _only_gpu_demand_failed

    report = {"require_gpu": True, "status": "fail", "checks": [
        {"name": "env", "status": "pass"},
        {"name": "cuda", "status": "fail", "original_status": "skip"},
        {"name": "cudnn_conv", "status": "fail", "original_status": "substituted"}]}
    assert _only_gpu_demand_failed(report, require_gpu=False)
    assert not _only_gpu_demand_failed(report, require_gpu=True)
    report["checks"].append({"name": "amp_train", "status": "fail"})
    assert not _only_gpu_demand_failed(report, require_gpu=False)


def test_a_foreign_image_runs_emulated_with_a_longer_timeout_and_says_so(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_engine["Architecture"] = "arm64"
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("linux/amd64"))
    fake = use_docker(monkeypatch, FakeDocker(stdout=json.dumps(report("cuda"))))
    result = bsmoke.run_smoke("local/torch:x", require_gpu=False, gpus=None, report_path=None)
    args = fake.run_args
    assert args[args.index("--platform") + 1] == "linux/arm64"
    assert float(args[args.index("--timeout-scale") + 1]) == platforms.EMULATED_TIMEOUT_SCALE
    assert (result["platform"], result["emulated"]) == ("linux/arm64", True)
    assert result["runner"]["emulated"] is True
    jsonschema.Draft202012Validator(SCHEMA).validate(result)


def test_a_native_image_runs_without_platform_flag(
    fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("linux/amd64"))
    fake = use_docker(monkeypatch, FakeDocker(stdout=json.dumps(report("cuda"))))
    result = bsmoke.run_smoke("local/torch:x", require_gpu=False, gpus=None, report_path=None)
    assert "--platform" not in fake.run_args
    assert (result["platform"], result["emulated"]) == ("linux/amd64", False)
