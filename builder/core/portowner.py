"""Who listens on a local TCP port, as far as /proc tells: the socket's owner (uid) from
/proc/net/tcp{,6}, the process from the /proc/PID/fd links this user may read, and for a
registry its storage. `builder registry start|status` name it, so a user never publishes into
a registry that is not theirs without being told.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import socket
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the TCP state column of a listening socket


@dataclass(frozen=True)
class Listener:
    """A listening socket: its owner's uid, and the process when its fds are readable here."""

    uid: int
    pid: int | None
    argv: list[str]

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid {self.uid}"

    def describe(self) -> str:
        """`pid 812 (docker-registry serve /etc/docker/registry/config.yml), user root`."""
        if self.pid is None:
            return f"a process of user {self.user} (its pid is not readable by this user)"
        command = " ".join(self.argv)[:120] or "?"
        return f"pid {self.pid} (`{command}`), user {self.user}"

    def storage(self) -> str | None:
        """A docker-registry's storage folder, from the config file its command line names."""
        config = next((a for a in reversed(self.argv) if a.endswith((".yml", ".yaml"))), None)
        if self.pid is None or config is None:
            return None
        path = Path(f"/proc/{self.pid}/cwd") / config if not config.startswith("/") else \
            Path(config)
        try:
            text = path.read_text(errors="replace")[:65536]
        except OSError:
            return None
        with contextlib.suppress(ValueError, AttributeError):
            return json.loads(text)["storage"]["filesystem"]["rootdirectory"]
        found = re.search(r"rootdirectory:\s*[\"']?([^\s\"']+)", text)
        return found[1] if found else None

    def container_hint(self) -> str | None:
        """For `docker-proxy`: the container behind the port and how to find it."""
        if not self.argv or not self.argv[0].endswith("docker-proxy"):
            return None
        opts = dict(zip(self.argv[1::2], self.argv[2::2], strict=False))
        port = opts.get("-host-port", "")
        return (f"a Docker container publishes it ({opts.get('-container-ip', '?')}:"
                f"{opts.get('-container-port', '?')}): `docker ps --filter publish={port}`")


def listener(addr: str) -> Listener | None:
    """The process listening on `addr` (`HOST:PORT`), or None when no local socket listens
    (another host, or another network namespace)."""
    port = int(addr.rpartition(":")[2])
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == LISTEN and \
                        int(fields[1].rpartition(":")[2], 16) == port:
                    inodes[fields[9]] = int(fields[7])
    if not inodes:
        return None
    inode, uid = next(iter(inodes.items()))
    pid = _pid_of(f"socket:[{inode}]")
    return Listener(uid, pid, _argv(pid) if pid else [])


def _pid_of(link: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == link:
                        return int(proc.name)
    return None


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def free_port(host: str, start: int, tries: int = 100) -> int | None:
    """The first port from `start` on that nothing listens on (bindable here)."""
    for port in range(start, min(start + tries, 65536)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return None
