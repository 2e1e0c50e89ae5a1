"""`builder registry start|stop|status`: a local registry (Debian's `docker-registry` 2.8).

Everything lives in one folder (default `<state>/registry/`): `config.yml`, `storage/`,
`registry.pid`, `registry.log`. `start` is idempotent and returns once `GET /v2/` answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from builder.core import proc, state
from builder.core.oci import RegistryError, registry_url

BINARY = "docker-registry"
INSTALL_HINT = "install it: apt-get install docker-registry"
START_TIMEOUT_S = 15.0


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
    """The pid in the pid file, when that process is still a docker-registry."""
    try:
        pid = int((folder / "registry.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    # A recycled pid belongs to someone else: never signal it.
    return pid if b"registry" in cmdline else None


def start(addr: str, storage: Path | None = None) -> int | None:
    """Start a registry on `addr` unless one answers there; wait until it does. Returns its pid."""
    folder = home(storage)
    if is_up(addr):
        return recorded_pid(folder)
    binary = proc.which(BINARY, hint=INSTALL_HINT)
    config = folder / "config.yml"
    state.atomic_write(config, config_text(addr, folder))
    pid = recorded_pid(folder)
    if pid is None:
        log = (folder / "registry.log").open("a")
        # A daemon outlives this process, so it is started with Popen in its own session rather
        # than with proc.run (which waits for the command to end).
        child = subprocess.Popen(
            [binary, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        pid = child.pid
        state.atomic_write(folder / "registry.pid", f"{pid}\n")
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
    """Stop the registry started from this folder (by its pid). False when none was running."""
    folder = home(storage)
    pid = recorded_pid(folder)
    (folder / "registry.pid").unlink(missing_ok=True)
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

