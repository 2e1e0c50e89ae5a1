"""A Docker engine of a test's own: a second dockerd with its own data root, exec root (and so its
own containerd), socket, pid file and bridge, stopped and removed afterwards, on failure too.

For a test that must empty what it did not make (the reproduce test prunes BuildKit's layer
cache): on its own engine the shared engine's build cache stays whole under every other test.
Its bridge is made here (`ip link add … type bridge`) and given to dockerd with `--bridge`:
never `--bridge=none`, which makes dockerd delete the host's `docker0`. dockerd reads no
`/etc/docker/daemon.json` (an empty `--config-file`), so nothing of the host's engine is shared.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.core import proc

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Engine:
    host: str  # DOCKER_HOST: unix://…/docker.sock
    root: Path  # data root, exec root, socket, pid file, log and config, all under it
    bridge: str

    def docker(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "1"}
        return subprocess.run([DOCKER, *args], env=env, capture_output=True, text=True,
                              check=True, **kwargs)  # type: ignore[arg-type]


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no address or route of the host is in."""
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                           check=True).stdout + subprocess.run(
        ["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    for net in ipaddress.ip_network("10.213.0.0/16").subnets(new_prefix=24):
        if f"{net.network_address}"[:-1] not in taken:  # "10.213.N." unused
            return net
    raise RuntimeError("no free /24 in 10.213.0.0/16 for a private engine's bridge")


@contextlib.contextmanager
def private_engine(images: tuple[str, ...] = ()) -> Iterator[Engine]:
    """Start a dockerd of its own with `images` loaded from the shared engine (docker save |
    docker load); yield it; stop it and remove its bridge, its iptables rules and its folder."""
    root = Path(tempfile.mkdtemp(prefix="ti-engine-", dir="/tmp"))  # a socket path is ≤ 107
    bridge = f"tib{uuid.uuid4().hex[:8]}"
    subnet = free_subnet()
    gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"
    engine = Engine(f"unix://{root}/docker.sock", root, bridge)
    daemon: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["ip", "link", "add", "name", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", gateway, "dev", bridge], check=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
        daemon = _start(engine)
        if images:
            _copy_images(images, engine)
        yield engine
    finally:
        if daemon is not None:
            _stop(daemon)
        subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)
        _drop_iptables_rules(bridge, str(subnet))
        shutil.rmtree(root, ignore_errors=True)


def _start(engine: Engine) -> subprocess.Popen[bytes]:
    (engine.root / "daemon.json").write_text(json.dumps({}))
    argv = [DOCKERD, "--config-file", str(engine.root / "daemon.json"),
            "--data-root", str(engine.root / "data"), "--exec-root", str(engine.root / "exec"),
            "-H", engine.host, "--pidfile", str(engine.root / "docker.pid"),
            "--bridge", engine.bridge]
    with open(engine.root / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            break
        with contextlib.suppress(subprocess.CalledProcessError):
            engine.docker("info", timeout=10)
            return daemon
        time.sleep(0.5)
    _stop(daemon)
    tail = (engine.root / "dockerd.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the private dockerd did not answer on {engine.host}:\n{tail}")


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM (dockerd stops its containers and its containerd), SIGKILL after a while."""
    proc.stop_child(daemon, signal.SIGTERM, grace=STOP_TIMEOUT_S)


def _copy_images(images: tuple[str, ...], engine: Engine) -> None:
    """`docker save IMAGE… | DOCKER_HOST=… docker load`: what the engine needs, never rebuilt;
    one archive for all the names (tags of one image are saved and loaded once)."""
    saved = subprocess.Popen([DOCKER, "save", *images], stdout=subprocess.PIPE,
                             env={k: v for k, v in os.environ.items() if k != "DOCKER_HOST"})
    assert saved.stdout is not None
    try:
        engine.docker("load", stdin=saved.stdout, timeout=600)
    finally:
        saved.stdout.close()
        if saved.wait(600) != 0:
            raise RuntimeError(f"docker save {' '.join(images)} failed")


def _drop_iptables_rules(bridge: str, subnet: str) -> None:
    """The rules dockerd wrote for its bridge (it leaves some when it stops)."""
    for table in ("filter", "nat"):
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True,
                                check=False).stdout
        for rule in listed.splitlines():
            if rule.startswith("-A ") and (f" {bridge} " in f"{rule} " or subnet in rule):
                subprocess.run(["iptables", "-t", table, "-D", *rule.split()[1:]],
                               check=False, capture_output=True)
