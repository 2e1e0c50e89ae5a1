"""Issue #25 ("hostile inputs, round two"), the cases that need real processes: the embedded
registry's pid file (2), a foreign platform without emulation (9), signals (10)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import free_port, run_builder, smoke_with_fake_docker

ROOT = Path(__file__).resolve().parents[2]


# ---- 2. `registry stop` signals only the registry it started --------------------------------


@pytest.fixture
def impostor() -> subprocess.Popen[bytes]:
    """A process whose command line says `docker-registry`, as a recycled pid's might."""
    child = subprocess.Popen(["bash", "-c", "exec -a docker-registry sleep 300"])
    yield child
    child.kill()
    child.wait()


def test_registry_stop_never_signals_a_process_it_cannot_prove_it_started(tmp_path, impostor):
    env = {**os.environ, "BUILDER_STATE": str(tmp_path / "state")}
    folder = tmp_path / "state" / "registry"
    folder.mkdir(parents=True)
    for stale in (f"{impostor.pid}\n",  # the old format
                  f'{{"pid": {impostor.pid}, "start_time": "1"}}\n'):  # a recycled pid
        (folder / "registry.pid").write_text(stale)
        result = run_builder("registry", "stop", "--addr", f"127.0.0.1:{free_port()}", env=env)
        assert impostor.poll() is None, "an unrelated process was killed"
        assert f"names pid {impostor.pid}" in result.stderr or "no start time" in result.stderr
        assert not (folder / "registry.pid").exists()


def test_registry_start_replaces_a_stale_pid_file_and_says_so(tmp_path, impostor):
    env = {**os.environ, "BUILDER_STATE": str(tmp_path / "state")}
    folder = tmp_path / "state" / "registry"
    folder.mkdir(parents=True)
    (folder / "registry.pid").write_text(f'{{"pid": {impostor.pid}, "start_time": "1"}}\n')
    addr = f"127.0.0.1:{free_port()}"
    try:
        started = run_builder("registry", "start", "--addr", addr, env=env)
        assert f"names pid {impostor.pid}, now another process" in started.stderr
        assert "replacing it" in started.stderr
        assert f"registry up on {addr}" in started.stderr
        stopped = run_builder("registry", "stop", "--addr", addr, env=env)
        assert "registry stopped" in stopped.stderr
    finally:
        run_builder("registry", "stop", "--addr", addr, env=env, check=False)
    assert impostor.poll() is None


# ---- 10. SIGTERM kills the child container at once and the tool exits within 3 s -------------

# A stand-in `docker` (BUILDER_DOCKER): `run` is a client attached to a container that takes the
# engine's 10 s stop grace period on SIGTERM (it ignores the signal) and ends only when
# `rm -f` removes its container.
SLOW_TO_STOP = """\
#!/bin/bash
dir={dir}
case "$1" in
  info) echo '{{"ServerVersion": "24.0"}}' ;;
  image) echo '[{{"Id": "sha256:0123", "RepoDigests": [], "Config": {{"Labels": {{}}}}}}]' ;;
  run)
    trap 'echo "run got TERM" >> $dir/log' TERM
    echo started >> $dir/log
    for _ in $(seq 200); do [ -e $dir/removed ] && exit 137; sleep 0.05; done
    echo "run ended by itself" >> $dir/log ;;
  rm) echo "rm $*" >> $dir/log; touch $dir/removed ;;
esac
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_kills_the_smoke_container_and_exits_within_3_s(tmp_path, signum):
    log = tmp_path / "log"
    tool = smoke_with_fake_docker(tmp_path, SLOW_TO_STOP.format(dir=tmp_path), log)
    signalled = time.monotonic()
    tool.send_signal(signum)  # to the Python process alone, as `timeout` and CI runners do
    _, stderr = tool.communicate(timeout=30)
    took = time.monotonic() - signalled
    assert tool.returncode == 128 + signum, stderr
    assert took < 3, f"exited {took:.1f} s after {signal.Signals(signum).name}"
    assert "rm -f builder-smoke-" in log.read_text()  # killed and removed, not stopped
    assert "run ended by itself" not in log.read_text()
