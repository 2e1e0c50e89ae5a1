"""The embedded registry's pid file: `registry stop` signals only a registry it can prove it
started (pid and start time), and `registry start` replaces a stale pid file and says so."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import free_port, run_builder


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
