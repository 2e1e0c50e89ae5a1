"""Issue #25 case 1: `render --out` under interruption. A forked child writes the new output
and kills itself at the n-th traced event (deterministic: the same n stops at the same
instruction); the parent then finds DIR/<id> complete, the old tree or the new one. SIGTERM,
which the tool turns into an exception, is sent to the test's own process the same way."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from unittest import mock

import pytest

from builder.core import proc
from builder.model import lockfile, matrix
from builder.model.rendered import Rendered
from builder.stages import render

ROOT = Path(__file__).resolve().parents[3]
BUILDER = str(ROOT / "builder")  # builder/core, stages...: all of the tool's own code
CPU = "2.13.0-py3.11-cpu-runtime"


@pytest.fixture(scope="module")
def old_and_new() -> tuple[Rendered, Rendered]:
    m = matrix.load(ROOT / "matrix.yaml")
    v = m.variant(CPU)
    old = render.render(m, v, lockfile.require_lock(ROOT / "locks", v))
    new = dataclasses.replace(old, dockerfile=old.dockerfile + "# new\n",
                              dockerignore=old.dockerignore + "# new\n",
                              files={rel: text + "# new\n" for rel, text in old.files.items()})
    return old, new


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


class Tracer:
    """A sys.settrace function that calls `act` at its `stop_at`-th event (calls and lines,
    in files under `only`) and counts them."""

    def __init__(self, stop_at: int, act: Callable[[], None], only: str = "") -> None:
        self.stop_at, self.act, self.only, self.seen = stop_at, act, only, 0

    def __call__(self, frame: FrameType, _event: str, _arg: object) -> Tracer:
        if frame.f_code.co_filename.startswith(self.only):
            self.seen += 1
            if self.seen == self.stop_at:
                self.act()
        return self


def count_events(rendered: Rendered, out: Path, only: str = "") -> int:
    """How many traced events one write (over an existing output) has."""
    render.write(rendered, out)
    counter = Tracer(0, lambda: None, only)
    sys.settrace(counter)
    try:
        render.write(rendered, out)
    finally:
        sys.settrace(None)
    return counter.seen


def interrupted_write(rendered: Rendered, out: Path, stop_at: int, signum: int,
                      only: str = "") -> int:
    """Fork; the child writes `rendered` into `out` and sends itself `signum` at event
    `stop_at`. Returns the child's exit status (-9: killed; 143: stopped by SIGTERM).

    SIGINT and SIGTERM need no child: their handler raises Interrupted where the signal lands,
    so the write stops in this process as it would in the tool's (`interrupted_here`). A fork
    copies the test session's page tables, 20-50 ms each; SIGKILL needs one to die."""
    if signum != signal.SIGKILL:
        return interrupted_here(rendered, out, stop_at, signum, only)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            proc.install_signal_handlers()
            sys.settrace(Tracer(stop_at, lambda: os.kill(os.getpid(), signum), only))
            render.write(rendered, out)
        except proc.Interrupted as exc:
            code = exc.exit_code
        except BaseException:  # any other end: a failure the parent reports (99)
            code = 99
        finally:
            sys.settrace(None)
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def interrupted_here(rendered: Rendered, out: Path, stop_at: int, signum: int,
                     only: str = "") -> int:
    """`rendered` written into `out` here, the tool's signal handlers installed and `signum`
    raised in this process at event `stop_at`; the exit status the tool would have (0: the
    write ended before that event). The tool's process would then end, so the write runs
    under the pid of one that has ended (a later run treats its leftovers as a dead run's);
    the test process's own handlers are put back."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ended = ended_pid()
    proc.install_signal_handlers()
    with mock.patch.object(os, "getpid", lambda: ended):
        sys.settrace(Tracer(stop_at, lambda: signal.raise_signal(signum), only))
        try:
            render.write(rendered, out)
        except proc.Interrupted as exc:
            return exc.exit_code
        finally:
            sys.settrace(None)
            for s, handler in previous.items():
                signal.signal(s, handler)
    return 0


@functools.cache
def ended_pid() -> int:
    """The pid of a process that has ended (a child that exits at once, reaped): one fork."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def assert_old_or_new(out: Path, old: dict[str, str], new: dict[str, str], what: str) -> bool:
    """The output is complete, old or new; returns whether it is the new one."""
    found = tree(out / CPU)
    assert found in (old, new), f"{what}: DIR/{CPU} is neither the old nor the new output " \
        f"({len(found)} files: {sorted(found)[:5]})"
    return found == new


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_at_any_line_of_builder_code_leaves_old_or_new(tmp_path, old_and_new, signum):
    """Every stopping point in builder's own code (the two renames of the old swap included),
    in turn: the fault is injected between every two steps, not left to timing."""
    old, new = old_and_new
    out = tmp_path / "out"
    events = count_events(new, tmp_path / "count", BUILDER)
    old_tree, new_tree = tree(render.write(old, out)), tree(render.write(new, tmp_path / "n"))
    for stop_at in range(1, events + 1):
        status = interrupted_write(new, out, stop_at, signum, BUILDER)
        assert status in (-signal.SIGKILL, 128 + signal.SIGTERM), status
        if assert_old_or_new(out, old_tree, new_tree, f"{signum!r} at event {stop_at}"):
            render.write(old, out)
    render.write(new, out)  # the next run completes, and removes the dead runs' staging folders
    assert sorted(p.name for p in out.iterdir()) == [CPU]
    assert tree(out / CPU) == new_tree


def test_sigkill_at_200_random_points_leaves_old_or_new(tmp_path, old_and_new):
    """The property: SIGKILL at random instants (any traced event, the standard library's
    included) over 200 runs; the output is complete, old or new, every time."""
    old, new = old_and_new
    out = tmp_path / "out"
    events = count_events(new, tmp_path / "count")
    old_tree, new_tree = tree(render.write(old, out)), tree(render.write(new, tmp_path / "n"))
    rng = random.Random(25)
    outcomes = {True: 0, False: 0}
    for run in range(200):
        stop_at = rng.randint(1, events)
        assert interrupted_write(new, out, stop_at, signal.SIGKILL) == -signal.SIGKILL
        is_new = assert_old_or_new(out, old_tree, new_tree, f"run {run}, event {stop_at}")
        outcomes[is_new] += 1
        if is_new:
            render.write(old, out)
    assert outcomes[True] and outcomes[False], outcomes  # the kills fell on both sides


def test_a_planted_symlink_in_a_shared_out_is_never_followed(tmp_path, old_and_new):
    """Another user plants symlinks named like the staging folders (old scheme
    `.<id>.<pid>.tmp[.old]`, and the new scheme's prefix) pointing at their victim's folder."""
    old, _ = old_and_new
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    (victim / "Dockerfile").write_text("the victim's\n")
    out.mkdir()
    for name in (f".{CPU}.{os.getpid()}.tmp", f".{CPU}.{os.getpid()}.tmp.old",
                 f".{CPU}.{os.getpid()}.x.tmp", f".{CPU}.1.tmp"):
        (out / name).symlink_to(victim)
    render.write(old, out)
    render.write(old, out)
    assert tree(victim) == {"Dockerfile": "the victim's\n"}
    assert tree(out / CPU) == tree(render.write(old, tmp_path / "clean"))
