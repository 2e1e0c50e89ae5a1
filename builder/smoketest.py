"""`builder smoke IMAGE`: run the in-image smoke suite in a locked-down container; store the report.

The suite (`smoke/`, copied into every image at /opt/torch-images/smoke) prints its JSON report on
stdout. This side picks the container options (GPUs, shm, no network, read-only root), turns a
container that produced no report into a report with one `error` check, validates the report
against `smoke/report.schema.json` and stores it under `<state>/reports/<image-id-hex>.json`,
where publish reads it back through `load_report` and `report_passed`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from builder import engine, labels, platforms, proc, state
from builder.errors import BuilderError, CommandFailed, EngineError
from smoke import OK_STATUSES, SCHEMA_VERSION
from smoke.checks import CHECKS, GPU_CHECKS, timeout_for

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "smoke" / "report.schema.json"
# Whole-run limit: the suite's own per-check timeouts plus start-up.
CHECKS_TIMEOUT_S = sum(timeout_for(name, 1.0) for name in CHECKS)
STARTUP_S = 300
TAIL_LINES = 40


def report_file(image_id: str) -> Path:
    return state.root() / "reports" / f"{image_id.removeprefix('sha256:')}.json"


# ---- host side: which container options -------------------------------------------------------


def host_has_gpu() -> bool:
    """An NVIDIA GPU on this host: a device node, or `nvidia-smi -L` listing one."""
    if Path("/dev/nvidia0").exists():
        return True
    try:
        result = proc.run(["nvidia-smi", "-L"], check=False, timeout=30)
    except BuilderError:  # not installed, or hung
        return False
    return result.returncode == 0 and "GPU" in result.stdout


def gpu_args(gpus: str | None, host_gpu: bool) -> list[str]:
    """`--gpus` for docker run: all on a GPU host, or what the user named ("0,1", "device=1")."""
    if gpus is None:
        return ["--gpus", "all"] if host_gpu else []
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
        "-w", labels.SMOKE_DIR, *gpu_flags, *(["--platform", platform] if platform else []),
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


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validation_error(report: Any) -> str | None:
    """The first schema violation, as `path: message`, or None."""
    import jsonschema  # slow import; only when validating

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path) or "(root)"
    return f"{where}: {first.message}"


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
    path = report_file(image_id)
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
    path = report_file(image_id)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise BuilderError(
            f"smoke report {path} is not valid JSON: {exc}",
            hint=f"delete it and run `builder smoke {image_id}` again",
        ) from None


def _describe_failures(report: dict[str, Any]) -> str:
    bad = [c for c in report.get("checks", []) if c.get("status") not in OK_STATUSES]
    return "; ".join(
        f"{c.get('name')} {c.get('status')}: {(c.get('message') or '').splitlines()[0][:200]}"
        if c.get("message") else f"{c.get('name')} {c.get('status')}" for c in bad
    )


def _only_gpu_demand_failed(report: dict[str, Any], require_gpu: bool) -> bool:
    """A --require-gpu run on a host without GPUs fails checks that otherwise stood in honestly
    (skip/substituted). When the gate does not demand a GPU, those count as what they were."""
    if require_gpu or not report.get("require_gpu"):
        return False
    return all(c.get("status") in OK_STATUSES or c.get("original_status") in OK_STATUSES
               for c in report.get("checks", []))


def report_passed(report: dict[str, Any] | None, *, require_gpu: bool) -> tuple[bool, str]:
    """The publish gate. With `require_gpu`, a CUDA image's report must come from a GPU run."""
    if report is None:
        return False, "no smoke report for this image: run `builder smoke IMAGE` first"
    problem = validation_error(report)
    if problem:
        return False, f"the smoke report does not match its schema ({problem})"
    if report["status"] != "pass" and not _only_gpu_demand_failed(report, require_gpu):
        return False, f"smoke failed: {_describe_failures(report) or 'overall status fail'}"
    if report.get("facts") is None:
        return False, "the smoke report has no image facts: the image's versions were not checked"
    is_cuda = (report["facts"] or {}).get("accelerator") == "cuda"
    if require_gpu and is_cuda:
        if not report.get("require_gpu"):
            return False, (
                "the smoke report of this CUDA image was made without --require-gpu: run "
                "`builder smoke IMAGE --require-gpu` on a host with NVIDIA GPUs"
            )
        not_on_gpu = [c["name"] for c in report["checks"]
                      if c["name"] in GPU_CHECKS and c["status"] != "pass"]
        if not_on_gpu:
            return False, f"GPU checks did not pass on a GPU: {', '.join(not_on_gpu)}"
    checks = len(report["checks"])
    where = "with --require-gpu" if report.get("require_gpu") else "without --require-gpu"
    return True, f"smoke passed ({checks} checks, {where})"


# ---- running ----------------------------------------------------------------------------------


def _resolve(image: str) -> tuple[str, str | None, dict[str, str]]:
    info = engine.inspect_image(image)
    if info is None:
        raise EngineError(f"no image `{image}` in the engine", hint="build it first: builder build")
    digests = info.get("RepoDigests") or []
    digest = digests[0].split("@", 1)[-1] if digests else None
    return info["Id"], digest, (info.get("Config") or {}).get("Labels") or {}


def _run_container(args: list[str], name: str, timeout: float) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr); a timed-out container is removed."""
    try:
        result = engine.docker(*args, check=False, timeout=timeout)
    except CommandFailed as exc:  # proc.run's timeout: the client died, the container may not
        engine.docker("rm", "-f", name, check=False)
        return None, "", f"{exc}\n{exc.hint or ''}"
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the container must not outlive the tool
        engine.docker("rm", "-f", name, check=False)
        raise
    return result.returncode, result.stdout or "", result.stderr or ""


def _hint(output: str) -> str:
    if "could not select device driver" in output:
        return ": docker cannot pass GPUs (install the NVIDIA Container Toolkit or drop --gpus)"
    if "No module named smoke" in output:
        return f": the image has no smoke suite at {labels.SMOKE_DIR}/smoke"
    return ""


def run_smoke(
    image: str, *, require_gpu: bool, gpus: str | None, report_path: Path | None,
    timeout_scale: float = 1.0,
) -> dict[str, Any]:
    """Run the suite in `image`, store and return its (schema-valid) report."""
    engine.ensure_engine()
    image_id, digest, image_labels = _resolve(image)
    # --require-gpu means nothing for a cpu image: its GPU checks are `skip` by design.
    effective_require = require_gpu and image_labels.get(labels.ACCELERATOR) != "cpu"
    name = f"builder-smoke-{uuid.uuid4().hex[:12]}"
    gpu_flags = gpu_args(gpus, host_has_gpu())
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
              "platform": platform.name if platform else None, "emulated": emulated}
    started, clock = _now(), dt.datetime.now(dt.UTC)
    rc, stdout, stderr = _run_container(args, name, CHECKS_TIMEOUT_S * timeout_scale + STARTUP_S)
    report = parse_report(stdout)
    elapsed = (dt.datetime.now(dt.UTC) - clock).total_seconds()
    output = stderr + ("\n" + stdout if stdout.strip() else "")
    if not isinstance(report, dict):
        what = "timed out" if rc is None else f"exited with {rc}"
        message = f"the smoke container {what} without a JSON report{_hint(output)}"
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


# ---- CLI --------------------------------------------------------------------------------------

HELP = f"""\
Run the smoke suite inside IMAGE and store its report for the publish gate.

The container runs with --rm --network none --read-only (tmpfs /tmp), --shm-size=8g and, on a
host with NVIDIA GPUs, --gpus all (or --gpus SPEC). Each check runs in its own process with its
own timeout: {", ".join(CHECKS)}. On a host
without GPUs the GPU checks of a CUDA image are `skip` or `substituted` (a CPU stand-in ran),
never `pass`; --require-gpu turns those into failures, and publishing a CUDA image needs a report
made with --require-gpu.

The report is stored at $BUILDER_STATE/reports/<image-id>.json (default .state/) and, with
--report, also written to FILE. IMAGE may be REGISTRY/REPOSITORY@sha256:DIGEST (a staged
image): it is pulled, and the report is attached to that digest in the registry, where
`builder publish` on any machine finds it. Exit status: 0 when the report passes, 1 when it
does not, 2 when it could not run.
"""


def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "smoke", parents=[common], help="run the smoke suite inside an image",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("image", metavar="IMAGE", help="image reference or id")
    p.add_argument("--require-gpu", action="store_true",
                   help="fail GPU checks that did not fully run on a GPU (needed to publish CUDA)")
    p.add_argument("--gpus", metavar="SPEC",
                   help='GPUs for the container: "all", a count, "0,1" or "device=1" '
                   "(default: all when the host has NVIDIA GPUs, none otherwise)")
    p.add_argument("--report", type=Path, metavar="FILE", help="also write the report here")
    p.add_argument("--timeout-scale", type=positive_float, default=1.0, metavar="X",
                   help="multiply every per-check timeout, e.g. 3 on a slow machine "
                   "(default %(default)s)")
    p.set_defaults(func=_cmd)


def positive_float(text: str) -> float:
    """argparse type: a finite number above zero (a zero or negative scale times every check
    out at once, and its error report would replace the image's stored one)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def _cmd(args: argparse.Namespace) -> int:
    from builder import evidence

    staged = evidence.from_reference(args.image)
    image = evidence.pull(staged) if staged else args.image
    report = run_smoke(image, require_gpu=args.require_gpu, gpus=args.gpus,
                       report_path=args.report, timeout_scale=args.timeout_scale)
    evidence.record(staged, "smoke", (json.dumps(report, indent=2) + "\n").encode())
    passed, reason = report_passed(report, require_gpu=args.require_gpu)
    if args.json:
        print(json.dumps(report, indent=2))
    elif sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        _print_rich(report, passed, reason)
    else:
        print(format_table(report, passed, reason))
    return 0 if passed else 1


def _row(check: dict[str, Any]) -> tuple[str, str, str, str]:
    status = check["status"]
    if "original_status" in check:
        status += f" (was {check['original_status']})"
    message = check.get("message", "")
    for warning in check.get("warnings", []):
        message += f"\nwarning: {warning}"
    return check["name"], status, f"{check.get('duration_s', 0):.1f}s", message


def format_table(report: dict[str, Any], passed: bool, reason: str) -> str:
    rows = [("check", "status", "time", "message"), *(_row(c) for c in report["checks"])]
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


def _print_rich(report: dict[str, Any], passed: bool, reason: str) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {"pass": "green", "fail": "red", "error": "red", "skip": "yellow",
               "substituted": "yellow", "degraded": "yellow"}
    table = Table(title=f"smoke: {(report.get('image') or {}).get('ref')}")
    for column in ("check", "status", "time", "message"):
        table.add_column(column, justify="right" if column == "time" else "left")
    for check in report["checks"]:
        name, status, time_s, message = _row(check)
        table.add_row(name, f"[{colours.get(check['status'], 'white')}]{status}[/]", time_s,
                      message, )
    console = Console()
    console.print(table)
    console.print(f"[{'green' if passed else 'red'}]{'PASS' if passed else 'FAIL'}[/]: {reason}")
