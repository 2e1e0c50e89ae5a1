"""`builder smoke IMAGE`: run the in-image smoke suite in a locked-down container; store the report.

The suite (`smoke/`, copied into every image at /opt/torch-images/smoke) prints its JSON report on
stdout. This side picks the container options (GPUs, shm, no network, read-only root), turns a
container that produced no report into a report with one `error` check, validates the report
against `smoke/report.schema.json` and stores it under `<state>/reports/<image-id-hex>.json`,
where publish reads it back (the verdict: builder.model.smokereport).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from builder.core import engine, labels, state
from builder.core.errors import BuilderError, CommandFailed, EngineError
from builder.model import gpuhost, platforms
from builder.model.smokereport import validation_error
from smoke import SCHEMA_VERSION
from smoke.checks import CHECKS, timeout_for
from smoke.host import PROBE_TIMEOUT_S
from smoke.runner import KILL_GRACE_S

# Whole-run limit: the suite's own per-check timeouts (each with its grace after SIGKILL) and
# its bounded driver probes, plus start-up.
CHECKS_TIMEOUT_S = sum(timeout_for(name, 1.0) + KILL_GRACE_S for name in CHECKS) \
    + 2 * PROBE_TIMEOUT_S
STARTUP_S = 300
TAIL_LINES = 40


# ---- host side: which container options -------------------------------------------------------


def gpu_args(gpus: str | None, default: list[str]) -> list[str]:
    """GPU flags for docker run: `default` (what the engine offers, `gpuhost.engine_gpu_flags`)
    unless the user named them: "all", a count, "0,1", "device=1" or "none"."""
    if gpus is None:
        return default
    if gpus in ("", "none"):
        return []
    if gpus == "all" or gpus.isdigit():  # a bare count: "--gpus 2"
        return ["--gpus", gpus]
    spec = gpus if gpus.startswith("device=") else f"device={gpus}"
    # docker's --gpus is CSV-parsed: a device list with commas must itself be quoted.
    return ["--gpus", f'"{spec}"' if "," in spec else spec]


def docker_run_args(
    image: str, image_id: str, *, name: str, digest: str | None, require_gpu: bool,
    gpu_flags: list[str], timeout_scale: float, platform: str | None = None,
) -> list[str]:
    # Read-only root with an exec-able /tmp (inductor and triton load .so files from their
    # caches); HOME points there too since uid 1000 may have no writable home.
    args = [
        "run", "--rm", "--name", name, "--network", "none", "--read-only",
        "--tmpfs", "/tmp:rw,exec,nosuid,nodev", "--shm-size=8g",
        "-e", "HOME=/tmp", "-e", "PYTHONDONTWRITEBYTECODE=1",
        "-w", labels.SMOKE_WORKDIR, *gpu_flags, *(["--platform", platform] if platform else []),
        image,
        "python", "-m", "smoke", "--report", "-", "--image-ref", image, "--image-id", image_id,
        "--timeout-scale", str(timeout_scale),
    ]
    if digest:
        args += ["--image-digest", digest]
    if require_gpu:
        args.append("--require-gpu")
    return args


# ---- reports ----------------------------------------------------------------------------------



def parse_report(stdout: str) -> Any:
    """The JSON object on stdout; tolerates stray lines before it (e.g. from an entrypoint)."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for index, char in enumerate(text):
        if char == "{" and (index == 0 or text[index - 1] == "\n"):
            try:
                return decoder.raw_decode(text[index:])[0]
            except ValueError:
                continue
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-TAIL_LINES:])


def error_report(
    image: str, image_id: str | None, *, message: str, output: str, require_gpu: bool,
    started: str, duration_s: float = 0.0, runner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A valid report with one `error` check: what is stored when the container gave no report."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "builder.smoketest", "version": "0.1.0"},
        "image": {"ref": image, "id": image_id, "digest": None},
        "facts": None,
        "host": {},
        "runner": runner or {},
        "require_gpu": require_gpu,
        "started": started,
        "finished": _now(),
        "status": "fail",
        "checks": [{
            "name": "container", "status": "error", "duration_s": round(duration_s, 3),
            "message": message, "metrics": {}, "output_tail": _tail(output),
        }],
    }


def _atomic_write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_report(report: dict[str, Any], image_id: str, report_path: Path | None) -> Path:
    path = state.evidence_path("smoke", image_id)
    for target in (path, report_path):
        if target is None:
            continue
        try:
            _atomic_write(target, report)
        except OSError as exc:
            raise state.path_error(target, exc) from None
    return path


def load_report(image_id: str) -> dict[str, Any] | None:
    """The stored report for an image id (`sha256:<hex>` or hex), or None if none was stored."""
    path = state.evidence_path("smoke", image_id)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise BuilderError(
            f"smoke report {path} is not valid JSON: {exc}",
            hint=f"delete it and run `builder smoke {image_id}` again",
        ) from None



# ---- running ----------------------------------------------------------------------------------


def _resolve(image: str) -> tuple[str, str | None, dict[str, str]]:
    info = engine.inspect_image(image)
    if info is None:
        raise EngineError(f"no image `{image}` in the engine", hint="build it first: builder build")
    digests = info.get("RepoDigests") or []
    digest = digests[0].split("@", 1)[-1] if digests else None
    return info["Id"], digest, (info.get("Config") or {}).get("Labels") or {}


def _run_container(args: list[str], name: str, timeout: float) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr); a timed-out container is removed, and on
    SIGINT/SIGTERM it is killed at once (engine.run_container)."""
    try:
        result = engine.run_container(name, args, check=False, timeout=timeout)
    except CommandFailed as exc:  # proc.run's timeout: the client died, the container may not
        engine.docker("rm", "-f", name, check=False)
        return None, "", f"{exc}\n{exc.hint or ''}"
    return result.returncode, result.stdout or "", result.stderr or ""


def _hint(output: str) -> str:
    if "could not select device driver" in output:
        return ": docker cannot pass GPUs (install the NVIDIA Container Toolkit or drop --gpus)"
    if "No module named smoke" in output:
        return f": the image has no smoke suite at {labels.SMOKE_WORKDIR}/smoke"
    return ""


def _refusal(output: str, image_labels: dict[str, str]) -> str | None:
    """The NVIDIA runtime's `unsatisfied condition` error, with the node's driver when this
    machine is the node (a local engine)."""
    if not gpuhost.REQUIREMENT_ERROR.search(output):
        return None
    driver = gpuhost.local_driver() if gpuhost.engine_is_local() else None
    return gpuhost.requirement_error(output, image_labels, driver)


def run_smoke(
    image: str, *, require_gpu: bool, gpus: str | None, report_path: Path | None,
    timeout_scale: float = 1.0,
) -> dict[str, Any]:
    """Run the suite in `image`, store and return its (schema-valid) report."""
    info = engine.ensure_engine()
    image_id, digest, image_labels = _resolve(image)
    # --require-gpu means nothing for a cpu image: its GPU checks are `skip` by design.
    effective_require = require_gpu and image_labels.get(labels.ACCELERATOR) != "cpu"
    name = f"builder-smoke-{uuid.uuid4().hex[:12]}"
    offered, gpu_source = gpuhost.engine_gpu_flags(info)
    gpu_flags = gpu_args(gpus, offered)
    # An image of another architecture runs under qemu: the CPU-side checks run for real but
    # slowly, and the report says so (its GPU checks are skip/substituted as on any CPU host).
    platform = platforms.of_image(engine.inspect_image(image_id) or {})
    emulated = platform is not None and platforms.emulated(platform.name)
    if emulated:
        timeout_scale = max(timeout_scale, platforms.EMULATED_TIMEOUT_SCALE)
    args = docker_run_args(image, image_id, name=name, digest=digest,
                           require_gpu=effective_require, gpu_flags=gpu_flags,
                           timeout_scale=timeout_scale,
                           platform=platform.name if emulated and platform else None)
    runner = {"kind": "docker", "command": ["docker", *args], "require_gpu_requested": require_gpu,
              "platform": platform.name if platform else None, "emulated": emulated,
              "gpus": {"flags": gpu_flags, "source": "--gpus" if gpus is not None else gpu_source}}
    started, clock = _now(), dt.datetime.now(dt.UTC)
    rc, stdout, stderr = _run_container(args, name, CHECKS_TIMEOUT_S * timeout_scale + STARTUP_S)
    report = parse_report(stdout)
    elapsed = (dt.datetime.now(dt.UTC) - clock).total_seconds()
    output = stderr + ("\n" + stdout if stdout.strip() else "")
    if not isinstance(report, dict):
        what = "timed out" if rc is None else f"exited with {rc}"
        message = _refusal(output, image_labels) or \
            f"the smoke container {what} without a JSON report{_hint(output)}"
        report = error_report(image, image_id, message=message, output=output,
                              require_gpu=effective_require, started=started,
                              duration_s=elapsed, runner=runner)
    else:
        report.setdefault("runner", {}).update(runner)
        problem = validation_error(report)
        if problem:
            report = error_report(image, image_id, message=f"the smoke report does not match "
                                  f"its schema: {problem}", output=output,
                                  require_gpu=effective_require, started=started,
                                  duration_s=elapsed, runner=runner)
    # Which platform's image this report is of, and whether its checks ran under qemu (also at
    # the top level; the schema leaves it open, and changing it would rebuild every image).
    report |= {"platform": runner["platform"], "emulated": emulated}
    store_report(report, image_id, report_path)
    return report


def report_row(check: dict[str, Any]) -> tuple[str, str, str, str]:
    """One check of a report as the table shows it: name, status, time, message (+ warnings)."""
    status = check["status"]
    if "original_status" in check:
        status += f" (was {check['original_status']})"
    message = check.get("message", "")
    for warning in check.get("warnings", []):
        message += f"\nwarning: {warning}"
    return check["name"], status, f"{check.get('duration_s', 0):.1f}s", message


def format_table(report: dict[str, Any], passed: bool, reason: str) -> str:
    """A smoke report as a plain-text table and its verdict (`builder smoke`, bench/arm64.py)."""
    rows = [("check", "status", "time", "message"), *(report_row(c) for c in report["checks"])]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for row in rows:
        first, *rest = row[3].splitlines() or [""]
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  "
                     f"{first}")
        lines += [" " * (sum(widths) + 6) + f"  {more}" for more in rest]
    image = report.get("image") or {}
    lines.append(f"{'PASS' if passed else 'FAIL'}: {reason} — {image.get('ref')} {image.get('id')}")
    return "\n".join(lines)
