"""The smoke suite's parent process: runs each check in its own subprocess; never imports torch.

`torch-smoke` (in every image) or `python -m smoke [--require-gpu] [--json [FILE]]
[--facts FILE] [--checks a,b] [--timeout-scale X] [--venv DIR --lock FILE]`.
Exit status: 0 every check ok, 1 a check failed, 2 the suite could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from smoke import (
    DEGRADED,
    ERROR,
    FAIL,
    OK_STATUSES,
    SCHEMA_VERSION,
    SKIP,
    SUBSTITUTED,
    __version__,
)
from smoke.checks import CHECKS, ran_fully_on_gpu, timeout_for
from smoke.facts import DEFAULT_FACTS, load_facts
from smoke.host import host_facts

PACKAGE_PARENT = Path(__file__).resolve().parent.parent
TAIL_LINES = 40
TAIL_CHARS = 4000
EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
KILL_GRACE_S = 30.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torch-smoke",
        description="Smoke-test this PyTorch image (or node): each check runs in its own process "
        "with its own timeout. A CPU host never reports a GPU check as passed.",
        epilog=f"checks: {', '.join(CHECKS)}. Exit status: 0 every check ok, 1 a check failed, "
        "2 the suite could not run.",
    )
    p.add_argument("--require-gpu", action="store_true",
                   help="fail GPU checks that were skipped, substituted or degraded")
    p.add_argument("--facts", type=Path, metavar="FILE",
                   help=f"the image's facts JSON (default: {DEFAULT_FACTS}, or LOCK.json with "
                   "--lock); a locks/<variant>.json works too")
    p.add_argument("--json", "--report", dest="report", nargs="?", const="-", metavar="FILE",
                   help="write the JSON report to FILE, or to stdout without FILE or with -")
    p.add_argument("--checks", metavar="a,b", help="only these checks, in this order")
    p.add_argument("--timeout-scale", type=float, default=1.0, metavar="X",
                   help="multiply every per-check timeout (default %(default)s)")
    p.add_argument("--image-ref", default=os.environ.get("SMOKE_IMAGE_REF"),
                   help="image reference recorded in the report ($SMOKE_IMAGE_REF)")
    p.add_argument("--image-id", default=os.environ.get("SMOKE_IMAGE_ID"),
                   help="image id recorded in the report ($SMOKE_IMAGE_ID)")
    p.add_argument("--image-digest", default=os.environ.get("SMOKE_IMAGE_DIGEST"),
                   help="registry digest recorded in the report ($SMOKE_IMAGE_DIGEST)")
    p.add_argument("--python", metavar="PATH",
                   help="interpreter for the checks (default: this one)")
    p.add_argument("--venv", type=Path, metavar="DIR",
                   help="outside Docker: create DIR from --lock and run the checks with it")
    p.add_argument("--lock", type=Path, metavar="FILE", help="hash-pinned requirements for --venv")
    args = p.parse_args(argv)
    if (args.venv is None) != (args.lock is None):
        p.error("--venv and --lock go together")
    if args.facts is not None and not args.facts.is_file():
        p.error(f"facts file {args.facts} does not exist")
    if args.timeout_scale <= 0:
        p.error("--timeout-scale must be positive")
    args.check_names = select_checks(p, args.checks)
    return args


def select_checks(p: argparse.ArgumentParser, spec: str | None) -> list[str]:
    if not spec:
        return list(CHECKS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return names


def prepare_venv(venv: Path, lock: Path) -> str:
    """Create `venv` from a hash-pinned lock; pip's output goes to stderr (stdout may be JSON)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "install", "--require-hashes", "-r", str(lock)],
                   check=True, stdout=sys.stderr)
    return str(python)


def resolve_facts(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str | None]:
    path = args.facts
    if path is None and args.lock is not None and args.lock.with_suffix(".json").is_file():
        path = args.lock.with_suffix(".json")
    if path is None and DEFAULT_FACTS.is_file():
        path = DEFAULT_FACTS
    if path is None:
        return None, None
    return load_facts(path), str(path)


def child_env(name: str, ctx: dict[str, Any], result_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    env["SMOKE_CONTEXT"] = json.dumps(ctx)
    env["SMOKE_RESULT"] = str(result_path)
    env["PYTHONUNBUFFERED"] = "1"  # output up to a crash reaches the tail
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault or abort prints the Python stack
    if name == "nccl_allreduce":
        env.setdefault("NCCL_DEBUG", "INFO")  # an init hang's tail then says where it stuck
        # Into files the check reads back (the transports NCCL chose) and the tail shows.
        env.setdefault("NCCL_DEBUG_FILE", str(result_path.parent / "nccl.%h.%p.log"))
    return env


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def tail(*paths: Path) -> str:
    """The last lines of the check's output, then of NCCL's debug files, if any."""
    texts = []
    for path in paths:
        try:
            texts.append(path.read_bytes()[-64 * 1024:].decode(errors="replace").rstrip())
        except OSError:
            continue
    text = "\n".join(t for t in texts if t)
    return "\n".join(text.splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]


def wait_bounded(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, bool]:
    """(exit status, timed out). A check still running at `timeout` is killed with its process
    group; one that does not die even then (stuck in the driver, state D) gives None after
    KILL_GRACE_S instead of blocking the suite and its report."""
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
    try:
        return proc.wait(timeout=KILL_GRACE_S), True
    except subprocess.TimeoutExpired:
        return None, True


def run_check(name: str, python: str, ctx: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one check in a new process group; a hang or crash becomes an `error` result."""
    with tempfile.TemporaryDirectory(prefix=f"smoke-{name}-") as tmp:
        result_path, log_path = Path(tmp, "result.json"), Path(tmp, "output.log")
        start = time.monotonic()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [python, "-m", "smoke.check", name], cwd=PACKAGE_PARENT,
                env=child_env(name, ctx, result_path), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                rc, timed_out = wait_bounded(proc, timeout)
            finally:  # leftovers (spawn workers of a finished check), or the suite was stopped
                kill_group(proc.pid)
        duration = time.monotonic() - start
        output = tail(log_path, *sorted(Path(tmp).glob("nccl.*.log")))
        check = interpret(name, rc, timed_out, timeout, result_path, output)
    return {"name": name, **check, "duration_s": round(duration, 3)}


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"


def interpret(
    name: str, rc: int | None, timed_out: bool, timeout: float, result_path: Path, output: str
) -> dict[str, Any]:
    if timed_out:
        hint = " (NCCL init hang? see the NCCL_DEBUG output)" if name == "nccl_allreduce" else ""
        killed = "was killed" if rc is not None else (
            f"did not exit {KILL_GRACE_S:.0f} s after SIGKILL (stuck in the GPU driver: check "
            "dmesg for Xid errors, the node needs a GPU reset or a reboot)")
        return {"status": ERROR, "metrics": {}, "output_tail": output,
                "message": f"timed out after {timeout:.0f} s and {killed}{hint}; "
                f"last output: {_last_line(output)}"}
    assert rc is not None
    try:
        check = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return {"status": ERROR, "metrics": {}, "output_tail": output,
                "message": f"the check process {_exit_text(rc)} without a result; "
                f"last output: {_last_line(output)}"}
    check.setdefault("metrics", {})
    check.setdefault("warnings", [])
    if rc != 0:
        check["warnings"].append(f"the check process {_exit_text(rc)} after reporting")
    if check.get("status") in (ERROR, FAIL):
        check["output_tail"] = output
    return check


def apply_require_gpu(check: dict[str, Any]) -> dict[str, Any]:
    """Under --require-gpu, a GPU check that did not fully run on a GPU (the shared rule,
    `ran_fully_on_gpu`) fails, and so does any other check that stood in for one."""
    status = check["status"]
    if status not in (SKIP, SUBSTITUTED, DEGRADED):
        return check
    if ran_fully_on_gpu(check) and status != SUBSTITUTED:
        return check
    return {**check, "status": FAIL, "original_status": status,
            "message": f"--require-gpu: {status}: {check['message']}"}


def overall(checks: list[dict[str, Any]]) -> str:
    return "pass" if all(c["status"] in OK_STATUSES for c in checks) else "fail"


def now() -> str:
    # timezone.utc, not dt.UTC: the suite runs on the image's Python, which may predate 3.11.
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


def cuda_devices(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices CUDA used, as the `cuda` check saw them (empty when no GPU ran it)."""
    cuda = next((c for c in checks if c["name"] == "cuda"), None)
    devices = ((cuda or {}).get("metrics") or {}).get("devices") or []
    keys = ("index", "name", "capability", "memory", "mig")
    return [{k: d.get(k) for k in keys} for d in devices if isinstance(d, dict)]


def build_report(
    args: argparse.Namespace, facts: dict[str, Any] | None, facts_source: str | None,
    host: dict[str, Any], checks: list[dict[str, Any]], started: str, python: str,
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "smoke", "version": __version__},
        "image": {"ref": args.image_ref, "id": args.image_id, "digest": args.image_digest},
        "facts": facts,
        "facts_source": facts_source,
        "host": {**host, "cuda_devices": cuda_devices(checks)},
        "runner": {"python": python, "venv": str(args.venv) if args.venv else None,
                   "lock": str(args.lock) if args.lock else None,
                   "timeout_scale": args.timeout_scale, "parent_python": platform.python_version()},
        "require_gpu": args.require_gpu,
        "started": started,
        "finished": now(),
        "status": overall(checks),
        "checks": checks,
    }


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table (the suite is stdlib-only; the host CLI may use rich)."""
    rows = [("check", "status", "time", "message")]
    for c in report["checks"]:
        status = c["status"] + (f" (was {c['original_status']})" if "original_status" in c else "")
        rows.append((c["name"], status, f"{c['duration_s']:.1f}s", c["message"][:110]))
        rows.extend(("", "", "", f"warning: {w}"[:110]) for w in c.get("warnings", []))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    lines.append(f"overall: {report['status'].upper()}"
                 + (" (--require-gpu)" if report["require_gpu"] else ""))
    return "\n".join(lines)


def write_report(report: dict[str, Any], target: str | None, stdout: TextIO) -> None:
    text = json.dumps(report, indent=2, default=str) + "\n"
    if target == "-":
        stdout.write(text)
        stdout.flush()
    elif target:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def cannot_run(python: str) -> str | None:
    """Why the checks cannot start with `python` (no interpreter, no torch), or None."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60,
                              check=False, cwd=PACKAGE_PARENT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot start {python}: {exc}"
    return None if done.returncode == 0 else f"{python} has no torch to test"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    python = args.python or sys.executable
    if args.venv is not None:
        try:
            python = prepare_venv(args.venv, args.lock)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"error: could not create {args.venv} from {args.lock}: {exc}", file=sys.stderr)
            return EXIT_CANNOT_RUN
    try:
        facts, facts_source = resolve_facts(args)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the facts file: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    problem = cannot_run(python)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    started = now()
    checks: list[dict[str, Any]] = []
    previous = signal.signal(signal.SIGTERM, _stop)
    stopped, host = 0, {}
    try:
        host = host_facts()
        ctx = {"facts": facts, "host": host, "require_gpu": args.require_gpu}
        for name in args.check_names:
            check = run_check(name, python, ctx, timeout_for(name, args.timeout_scale))
            checks.append(apply_require_gpu(check) if args.require_gpu else check)
    except (Stopped, KeyboardInterrupt) as exc:  # a report of what ran, not none at all
        stopped = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        left = [n for n in args.check_names if n not in {c["name"] for c in checks}]
        checks.append({"name": "suite", "status": ERROR, "duration_s": 0.0, "metrics": {},
                       "message": f"stopped by {signal.Signals(stopped).name} before "
                       f"{', '.join(left) or 'the end'} ran"})
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = build_report(args, facts, facts_source, host, checks, started, python)
    # The table goes to stdout unless the JSON report does.
    print(format_table(report), file=sys.stderr if args.report == "-" else sys.stdout, flush=True)
    write_report(report, args.report, sys.stdout)
    if stopped:
        return 128 + stopped
    return EXIT_OK if report["status"] == "pass" else EXIT_FAILED


class Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame: Any) -> None:
    """SIGTERM (docker stop, a CI timeout): stop the running check and write the report."""
    raise Stopped(signum)
