"""A transcript of the `builder` commands an end-to-end run ran: with `BUILDER_TRANSCRIPT=FILE`
in the environment, `helpers.run_builder` appends each command, its output and its exit status
to FILE, so a closing note can quote what the commands printed today rather than what a test
asserted about it. Unset, nothing is written.

Both xdist workers append to the same file: each entry goes in one `write` to a file opened
with O_APPEND, under an exclusive lock, so two entries never interleave.
"""

from __future__ import annotations

import fcntl
import os
import shlex
from collections.abc import Sequence

ENV = "BUILDER_TRANSCRIPT"


def entry(argv: Sequence[str], returncode: int, stdout: str, stderr: str,
          test: str | None = None) -> str:
    """One command's entry: `# the test` (when known), `$ builder ARGS`, its output (stdout,
    then stderr: the streams were captured apart), `exit N` and a blank line."""
    output = "".join(part if part.endswith("\n") else part + "\n"
                     for part in (stdout, stderr) if part)
    heading = f"# {test}\n" if test else ""
    return f"{heading}$ builder {shlex.join(argv)}\n{output}exit {returncode}\n\n"


def append(argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
    """Append the command's entry to $BUILDER_TRANSCRIPT, if set (the test's name from
    PYTEST_CURRENT_TEST, which pytest sets while a test runs)."""
    if not (path := os.environ.get(ENV)):
        return
    test = os.environ.get("PYTEST_CURRENT_TEST")
    data = entry(argv, returncode, stdout, stderr, test).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:  # one write in practice; a short one goes on where it stopped
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)  # closing releases the lock
