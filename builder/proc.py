"""The one place that runs external commands: prints them, finds the executable, checks the exit."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from io import BufferedReader
from pathlib import Path

from builder.errors import BuilderError, CommandFailed

VERBOSE = os.environ.get("BUILDER_VERBOSE", "") not in ("", "0")


def which(name: str, hint: str | None = None) -> str:
    """The absolute path of `name`, or a clear error naming it."""
    path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
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
    if VERBOSE:
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
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise CommandFailed with the command and the tail of its output.

    With `log`, stdout and stderr go to that file (appended) instead of being captured.
    """
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    if VERBOSE:
        print(f"$ {shlex.join(args)}", file=sys.stderr)
    full_env = {**os.environ, **env} if env else None
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as fh:
                fh.write(f"$ {shlex.join(args)}\n")
                fh.flush()
                result = subprocess.run(
                    args, env=full_env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                    text=True, timeout=timeout, input=input, check=False,
                )
        else:
            result = subprocess.run(
                args, env=full_env, cwd=cwd, capture_output=capture, text=True,
                timeout=timeout, input=input, check=False,
            )
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(f"`{shlex.join(args)}` timed out after {timeout:.0f} s") from exc
    if check and result.returncode != 0:
        raise CommandFailed(
            f"`{shlex.join(args)}` exited with {result.returncode}",
            hint=_tail(result, log),
        )
    return result


def _tail(result: subprocess.CompletedProcess[str], log: Path | None, lines: int = 25) -> str:
    if log is not None:
        text = log.read_text(errors="replace")
        where = f"full log: {log}\n"
    else:
        text = (result.stderr or "") + (result.stdout or "")
        where = ""
    return where + "\n".join(text.strip().splitlines()[-lines:])


HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def host_ca_bundle() -> str | None:
    """The host's CA bundle, for host-side HTTPS clients (pip, uv, urllib) that need it."""
    return HOST_CA_BUNDLE if os.path.exists(HOST_CA_BUNDLE) else None
