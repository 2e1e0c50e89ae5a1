"""`builder registry start|stop|status`: a local registry (Debian's `docker-registry` 2.8).

Everything lives in one folder (default `<state>/registry/`): `config.yml`, `storage/`,
`registry.pid`, `registry.log`. `start` is idempotent and returns once `GET /v2/` answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from builder.core import proc, state
from builder.core.oci import RegistryError, registry_url
from builder.core.output import step

BINARY = "docker-registry"
INSTALL_HINT = "install it: apt-get install docker-registry"
START_TIMEOUT_S = 15.0
PID_FILE = "registry.pid"  # {"pid", "start_time"}: a recycled pid has another start time


def home(storage: Path | None = None) -> Path:
    """The registry's folder: config, pid file, log and blob storage."""
    folder = storage if storage is not None else state.path("registry")
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def config_text(addr: str, folder: Path) -> str:
    # JSON is YAML: no YAML quoting traps with paths or addresses.
    return (
        '{"version": "0.1", "log": {"level": "info"},\n'
        f' "storage": {{"filesystem": {{"rootdirectory": "{folder / "storage"}"}},\n'
        '             "delete": {"enabled": false}},\n'
        f' "http": {{"addr": "{addr}"}}}}\n'
    )


def is_up(addr: str, timeout: float = 2.0) -> bool:
    """`GET /v2/` answers 200 (or 401: up, but wants credentials)."""
    try:
        with urllib.request.urlopen(f"{registry_url(addr)}/v2/", timeout=timeout) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError, ValueError):
        return False


def recorded_pid(folder: Path) -> int | None:
    """The pid in the pid file, when that process provably is the registry started from this
    folder (see `pid_file_check`)."""
    return pid_file_check(folder)[0]


def pid_file_check(folder: Path) -> tuple[int | None, str]:
    """(pid, "") when the pid file names the registry this folder started: the same process
    start time (a recycled pid has another) and `<binary> serve <folder>/config.yml` as its
    command line. (None, why) for a stale or unreadable pid file; (None, "") for none."""
    pid_file = folder / PID_FILE
    try:
        recorded = json.loads(pid_file.read_text())
        pid, started = int(recorded["pid"]), str(recorded["start_time"])
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError, TypeError, KeyError):
        return None, f"{pid_file} is not a pid file written by this version (no start time)"
    argv = _argv(pid)
    if argv is None:
        return None, f"{pid_file} names pid {pid}, which is not running"
    if _start_time(pid) != started or argv[-2:] != ["serve", str(folder / "config.yml")]:
        return None, (f"{pid_file} names pid {pid}, now another process "
                      f"(`{' '.join(argv)[:80]}`), not the registry started from {folder}")
    return pid, ""


def _argv(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # the fields after `(comm)` start at field 3


def _write_pid_file(folder: Path, pid: int) -> None:
    state.atomic_write(folder / PID_FILE, json.dumps({"pid": pid,
                                                      "start_time": _start_time(pid)}) + "\n")


def start(addr: str, storage: Path | None = None) -> int | None:
    """Start a registry on `addr` unless one answers there; wait until it does. Returns its pid.
    A stale pid file is said so and replaced."""
    folder = home(storage)
    if is_up(addr):
        return recorded_pid(folder)
    binary = proc.which(BINARY, hint=INSTALL_HINT)
    config = folder / "config.yml"
    state.atomic_write(config, config_text(addr, folder))
    pid, stale = pid_file_check(folder)
    if stale:
        step(f"{stale}: replacing it")
    if pid is None:
        pid = proc.start_daemon([binary, "serve", str(config)], log=folder / "registry.log")
        _write_pid_file(folder, pid)
    _wait_up(addr, pid, folder)
    return pid


def _wait_up(addr: str, pid: int, folder: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if is_up(addr):
            return
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                raise RegistryError(f"the registry exited at start (status {status})",
                                    hint=_log_tail(folder))
        time.sleep(0.2)
    raise RegistryError(f"the registry did not answer on {addr} within {START_TIMEOUT_S:.0f} s",
                        hint=_log_tail(folder))


def _log_tail(folder: Path, lines: int = 15) -> str:
    log = folder / "registry.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return f"log: {log}\n" + "\n".join(text.strip().splitlines()[-lines:])


def stop(storage: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the registry started from this folder: only a process the pid file proves is it
    (pid and start time, command line) is signalled. False when none was running."""
    folder = home(storage)
    pid, stale = pid_file_check(folder)
    (folder / PID_FILE).unlink(missing_ok=True)
    if stale:
        step(f"{stale}: not signalled; the pid file is removed")
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap our own child, if it is one
        if done:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and ") Z " in stat.read_text())  # a zombie is gone

