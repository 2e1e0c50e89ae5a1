"""SIGINT/SIGTERM to the builder process alone stop its children and its containers at once.

A fake `docker` (BUILDER_DOCKER) stands in for the engine: `run` records the signal it gets and
`rm` records its arguments, so no engine is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import smoke_with_fake_docker

ROOT = Path(__file__).resolve().parent.parent.parent

# Fake `docker` clients (BUILDER_DOCKER): the engine's answers, then what `run` and `rm` do.
ENGINE = """\
#!/bin/bash
log={log}
case "$1" in
  info) echo '{{"ServerVersion": "24.0"}}' ;;
  image) echo '[{{"Id": "sha256:0123", "RepoDigests": [], "Config": {{"Labels": {{}}}}}}]' ;;
"""
# `run` passes the signal to its child and exits by it.
FAKE_DOCKER = ENGINE + """\
  run)
    sleep 60 & child=$!
    trap 'echo "run got TERM" >> $log; kill $child; exit 143' TERM
    trap 'echo "run got INT" >> $log; kill $child; exit 130' INT
    echo started >> $log
    wait $child ;;
  rm) echo "rm $*" >> $log ;;
esac
"""
# `run` is a client attached to a container that takes the engine's 10 s stop grace period on
# SIGTERM (it ignores the signal) and ends only when `rm -f` removes its container.
SLOW_TO_STOP = ENGINE + """\
  run)
    trap 'echo "run got TERM" >> $log' TERM
    echo started >> $log
    for _ in $(seq 200); do [ -e $log.removed ] && exit 137; sleep 0.05; done
    echo "run ended by itself" >> $log ;;
  rm) echo "rm $*" >> $log; touch $log.removed ;;
esac
"""


@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGTERM, 143, "TERM"),
                                                      (signal.SIGINT, 130, "INT")])
def test_signal_stops_the_smoke_container_and_exits_128_plus_signal(
        tmp_path: Path, signum: int, code: int, name: str) -> None:
    log = tmp_path / "docker.log"
    tool = smoke_with_fake_docker(tmp_path, FAKE_DOCKER.format(log=log), log)
    tool.send_signal(signum)  # to the Python process alone, as `timeout` and CI do
    _, stderr = tool.communicate(timeout=30)
    assert tool.returncode == code, stderr
    assert "Traceback" not in stderr
    text = log.read_text()
    assert f"run got {name}" in text  # the docker client was told, not left running
    assert "rm -f builder-smoke-" in text  # and the container it started was removed
    assert not list((tmp_path / "state").rglob("*.json"))  # no report was written


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_kills_the_smoke_container_and_exits_within_3_s(tmp_path, signum):
    """A container slow to stop is killed and removed (`rm -f`), not stopped: the tool exits
    within 3 s (CI runners SIGKILL a few seconds after SIGTERM)."""
    log = tmp_path / "log"
    tool = smoke_with_fake_docker(tmp_path, SLOW_TO_STOP.format(log=log), log)
    signalled = time.monotonic()
    tool.send_signal(signum)  # to the Python process alone, as `timeout` and CI runners do
    _, stderr = tool.communicate(timeout=30)
    took = time.monotonic() - signalled
    assert tool.returncode == 128 + signum, stderr
    assert took < 3, f"exited {took:.1f} s after {signal.Signals(signum).name}"
    assert "rm -f builder-smoke-" in log.read_text()  # killed and removed, not stopped
    assert "run ended by itself" not in log.read_text()


CHILD = """\
import sys
from pathlib import Path
from builder.core import proc
proc.install_signal_handlers()
try:
    proc.run(["bash", "-c", sys.argv[1]], log=Path(sys.argv[2]))
except proc.Interrupted as exc:
    sys.exit(exc.exit_code)
"""


def test_a_logged_child_like_docker_build_gets_the_signal_not_sigkill(tmp_path: Path) -> None:
    record = tmp_path / "record"
    script = (f"sleep 60 & c=$!; trap 'echo TERM > {record}; kill $c; exit 1' TERM; "
              f"echo started > {record}; wait $c")
    tool = subprocess.Popen([sys.executable, "-c", CHILD, script, str(tmp_path / "build.log")],
                            cwd=ROOT, env={**os.environ, "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 30
    while not (record.exists() and record.read_text().strip() == "started"):
        assert time.monotonic() < deadline and tool.poll() is None
        time.sleep(0.05)
    tool.send_signal(signal.SIGTERM)
    assert tool.wait(timeout=30) == 143
    assert record.read_text().strip() == "TERM"
