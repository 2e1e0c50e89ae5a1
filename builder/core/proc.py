"""The one place that runs external commands: prints them, finds the executable, checks the exit."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from io import BufferedReader
from pathlib import Path
from typing import Any

from builder.core import settings
from builder.core.errors import BuilderError, CommandFailed


def which(name: str, hint: str | None = None) -> str:
    """The absolute path of `name`, or a clear error naming it. The tools installed beside this
    interpreter (uv, pip-audit, syft in the project venv) come first, activated or not."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path = (name if os.path.isabs(name) and os.access(name, os.X_OK)
            else shutil.which(name, path=search))
    if not path:
        raise BuilderError(f"couldn't find `{name}` on PATH", hint=hint)
    return path


@contextlib.contextmanager
def stream(argv: Sequence[str | os.PathLike[str]], *,
           env: Mapping[str, str] | None = None) -> Iterator[BufferedReader]:
    """Run a command and yield its stdout as a binary stream (1 MiB reads), for output too large
    to capture. When the block ends, the rest of stdout is drained and the exit checked:
    CommandFailed with the tail of stderr on a non-zero exit. On an exception the command is
    killed."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    if settings.current().verbose:
        print(f"$ {shlex.join(args)}", file=sys.stderr)
    full_env = {**os.environ, **env} if env else None
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=full_env,
                                 bufsize=1 << 20)
        assert child.stdout is not None
        try:
            yield child.stdout
            while child.stdout.read(1 << 20):  # a reader may stop before EOF (tar padding)
                pass
            returncode = child.wait()
        except BaseException:
            child.kill()
            child.wait()
            raise
        finally:
            child.stdout.close()
        if returncode != 0:
            err.seek(0)
            tail = err.read()[-4000:].decode(errors="replace").strip()
            raise CommandFailed(f"`{shlex.join(args)}` exited with {returncode}",
                                hint="\n".join(tail.splitlines()[-25:]))


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    capture: bool = True,
    check: bool = True,
    timeout: float | None = None,
    input: str | bytes | None = None,
    log: Path | None = None,
    on_interrupt: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise CommandFailed with the command and the tail of its output.

    With `log`, stdout and stderr go to that file (appended) instead of being captured.
    `on_interrupt` runs first when SIGINT/SIGTERM arrives while the command runs (e.g. killing
    the container a `docker run` started), before the command itself is stopped.
    """
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    if settings.current().verbose:
        print(f"$ {shlex.join(args)}", file=sys.stderr)
    full_env = {**os.environ, **env} if env else None
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as fh:
                fh.write(f"$ {shlex.join(args)}\n")
                fh.flush()
                result = _run_child(args, env=full_env, cwd=cwd, stdout=fh,
                                    stderr=subprocess.STDOUT, timeout=timeout, input=input,
                                    on_interrupt=on_interrupt)
        else:
            pipe = subprocess.PIPE if capture else None
            result = _run_child(args, env=full_env, cwd=cwd, stdout=pipe, stderr=pipe,
                                timeout=timeout, input=input, on_interrupt=on_interrupt)
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(f"`{shlex.join(args)}` timed out after {timeout:.0f} s") from exc
    if check and result.returncode != 0:
        raise CommandFailed(
            f"`{shlex.join(args)}` exited with {result.returncode}",
            hint=_tail(result, log),
        )
    return result


def start_daemon(argv: Sequence[str | os.PathLike[str]], *, log: Path) -> int:
    """Start a command that outlives this process (its own session, so no signal of ours
    reaches it; stdin closed; output appended to `log`) and return its pid without waiting:
    the caller checks that it came up."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    if settings.current().verbose:
        print(f"$ {shlex.join(args)} &", file=sys.stderr)
    with log.open("a") as fh:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return child.pid


# ---- signals ------------------------------------------------------------------------------------

# How long a child (docker build, docker run, docker push) gets to act on a forwarded signal (the
# docker client cancels the build or push, or stops the container) before it is killed.
STOP_GRACE_S = 10.0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the tool. A KeyboardInterrupt, so every `finally` runs and no
    `except Exception` swallows it; main() exits with 128 + the signal number (130, 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM become Interrupted in the main thread (SIGTERM would otherwise end
    the process at once, leaving its children running)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)


def _run_child(args: list[str], *, timeout: float | None, input: str | bytes | None,
               on_interrupt: Callable[[], object] | None = None,
               **popen: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run, except that a signal or timeout is passed on to the child (which then
    gets STOP_GRACE_S to clean up) instead of SIGKILLing it at once; on a signal,
    `on_interrupt` runs first."""
    with subprocess.Popen(args, text=True, stdin=subprocess.PIPE if input is not None else None,
                          **popen) as child:
        try:
            stdout, stderr = child.communicate(input, timeout=timeout)
        except BaseException as exc:
            if on_interrupt is not None and isinstance(exc, Interrupted):
                with contextlib.suppress(Exception):
                    on_interrupt()
            stop_child(child, exc.signum if isinstance(exc, Interrupted) else signal.SIGTERM)
            raise
    return subprocess.CompletedProcess(args, child.returncode, stdout, stderr)


def stop_child(child: subprocess.Popen[Any], signum: int, grace: float = STOP_GRACE_S) -> None:
    """Send `signum` to a running child, wait `grace` seconds for it to end, then kill it."""
    if child.poll() is not None:
        return
    try:
        child.send_signal(signum)
        child.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _tail(result: subprocess.CompletedProcess[str], log: Path | None, lines: int = 25) -> str:
    if log is not None:
        text = log.read_text(errors="replace")
        where = f"full log: {log}\n"
    else:
        text = (result.stderr or "") + (result.stdout or "")
        where = ""
    return where + "\n".join(text.strip().splitlines()[-lines:])


CA_BUNDLE_ENV = settings.CA_BUNDLE_ENV  # what `--ca-bundle` defaults to


def host_ca_bundle() -> str | None:
    """The CA bundle for host-side HTTPS clients (pip, uv, urllib) and builds: --ca-bundle or
    $BUILDER_CA_BUNDLE, else the system's (settings.current())."""
    return settings.current().host_ca_bundle()
