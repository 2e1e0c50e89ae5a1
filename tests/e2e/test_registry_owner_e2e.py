"""`builder registry start|status` on an address held by a registry this checkout did not start:
it says whose (pid, command, user, storage), exits 2 and suggests a free port; `status` says
whose registry answers. Never publishes into someone else's registry by surprise."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from helpers import free_port, run_builder

from builder.core import oci, registry
from builder.core.registry_http import RegistryError

HINT = "is it running? `builder registry start` (then `builder registry status`)"


@pytest.fixture
def other_registry(tmp_path: Path):
    """A registry started from another folder (another checkout, another user's)."""
    folder = tmp_path / "other"
    addr = f"127.0.0.1:{free_port()}"
    pid = registry.start(addr, folder)
    yield addr, folder, pid
    registry.stop(folder)


def test_start_on_a_port_held_by_another_registry_exits_2_naming_it(
        other_registry: tuple[str, Path, int], tmp_path: Path) -> None:
    addr, other, pid = other_registry
    mine = tmp_path / "mine"
    env = {**os.environ, "BUILDER_STATE": str(mine)}
    result = run_builder("registry", "start", "--addr", addr, env=env, check=False)
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: a registry this checkout did not start answers on {addr}: "
                            f"pid {pid} (`")
    assert f"serve {other / 'config.yml'}" in first and f"its storage: {other / 'storage'}" in first
    hint = result.stderr[result.stderr.index("hint:"):]
    assert f"would keep its storage in {mine / 'registry' / 'storage'}" in hint
    port = int(re.search(r"--addr 127\.0\.0\.1:(\d+)`", hint)[1])
    assert port != int(addr.rpartition(":")[2]) and not registry.is_up(f"127.0.0.1:{port}")
    assert not (mine / "registry" / "registry.pid").exists()  # nothing was started
    status = run_builder("registry", "status", "--addr", addr, env=env)
    assert status.stdout.startswith(f"{addr}: up, NOT this checkout's registry: pid {pid}")
    doc = json.loads(run_builder("registry", "status", "--addr", addr, "--json", env=env).stdout)
    assert doc["ours"] is False and f"pid {pid}" in doc["owner"]


def test_status_of_its_own_registry_says_it_is_its_own(tmp_path: Path) -> None:
    env = {**os.environ, "BUILDER_STATE": str(tmp_path / "state")}
    folder, addr = tmp_path / "state" / "registry", f"127.0.0.1:{free_port()}"
    try:
        started = run_builder("registry", "start", "--addr", addr, env=env)
        assert f"registry up on {addr}" in started.stderr
        status = run_builder("registry", "status", "--addr", addr, env=env)
        assert status.stdout == f"{addr}: up, the registry started from {folder}\n"
        again = run_builder("registry", "start", "--addr", addr, env=env)  # idempotent: exit 0
        assert f"registry up on {addr}" in again.stderr
    finally:
        registry.stop(folder)


# ---- a registry that is not running ------------------------------------------------------------


def test_a_refused_connection_fails_within_two_seconds_with_a_hint() -> None:
    reg = oci.Registry(f"127.0.0.1:{free_port()}")  # closed again: connecting is refused
    started = time.monotonic()
    with pytest.raises(RegistryError) as caught:
        reg.tags("torch")
    assert time.monotonic() - started < 2.0  # no retries: nothing listens there
    assert "connection refused (nothing listens there)" in str(caught.value)
    assert caught.value.hint == HINT and caught.value.exit_code == 2


@pytest.mark.parametrize("argv", [("verify", "--contents-only", "{addr}/torch:x"),
                                  ("catalog", "{addr}/torch", "--out", "{tmp}/site")])
def test_verify_and_catalog_say_to_start_the_registry(argv: tuple[str, ...],
                                                      tmp_path: Path) -> None:
    addr = f"127.0.0.1:{free_port()}"
    args = [a.format(addr=addr, tmp=tmp_path) for a in argv]
    result = run_builder(*args, check=False)
    assert result.returncode == 2
    assert "connection refused (nothing listens there)" in result.stderr.splitlines()[0]
    assert f"hint: {HINT}" in result.stderr
    doc = json.loads(run_builder(*args, "--json", check=False).stdout)
    assert doc["hint"] == HINT
