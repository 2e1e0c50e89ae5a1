"""The registry client's transport (under builder.core.registry_http): one urllib3 pool manager
per host with that host's TLS (the system store, `$BUILDER_CA_BUNDLE`, Docker's certs.d and its
client certificates), Docker's choice of insecure registries, and the overall deadline of an
operation, enforced by a watchdog that shuts the socket of a request still running when it comes
(a server trickling a byte at a time cannot outlast it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from builder.core import settings
from builder.core.errors import CommandFailed

CERTS_D = "/etc/docker/certs.d"
DAEMON_JSON = "/etc/docker/daemon.json"


class RegistryError(CommandFailed):
    """A registry did not answer, refused an operation or answered nonsense (exit 2)."""


class Transient(RegistryError):
    """Worth another try: a refused or dropped connection, a timeout, a 5xx."""


# ---- the deadline -------------------------------------------------------------------------------


@dataclass
class Deadline:
    """One operation's overall time limit."""

    seconds: float
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.at = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def check(self, registry: str, where: str) -> None:
        if self.left() <= 0:
            raise RegistryError(f"registry `{registry}`: {where}: no complete answer within "
                                f"the {self.seconds:.0f} s deadline")


# The watchdog of the request running on this thread (set by registry_http around a request).
WATCH = threading.local()


class _Watched:
    """A connection that tells the watchdog of the running request which socket to shut."""

    def connect(self) -> None:
        if (dog := getattr(WATCH, "dog", None)) is not None:
            dog.conn = self
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> Any:
        if (dog := getattr(WATCH, "dog", None)) is not None:
            dog.conn = self
        return super().request(*args, **kwargs)  # type: ignore[misc]


class _HTTP(_Watched, HTTPConnection):
    pass


class _HTTPS(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTP


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPS


class Watchdog:
    """Shuts the socket of a request that is still running when its deadline comes."""

    def __init__(self, deadline: Deadline) -> None:
        self.conn: Any = None
        self.fired = False
        self.timer = threading.Timer(max(deadline.left(), 0.0), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        with contextlib.suppress(OSError, AttributeError):
            self.conn.sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()


# ---- TLS and schemes ----------------------------------------------------------------------------


def split_host(netloc: str) -> str:
    """The host of `host[:port]` (IPv6 in brackets kept without them)."""
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def is_loopback(netloc: str) -> bool:
    host = split_host(netloc)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _insecure_setting() -> list[str]:
    """--insecure-registry, the matrix's `insecure_registries` and $BUILDER_INSECURE_REGISTRIES
    (settings.current()), then the daemon's own list."""
    listed = list(settings.current().insecure_registries)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        listed += list(json.loads(Path(DAEMON_JSON).read_text()).get("insecure-registries", []))
    return listed


def is_insecure(registry: str) -> bool:
    """Docker's `insecure-registries`: loopback, plus `host[:port]` entries and CIDRs."""
    if is_loopback(registry):
        return True
    host = split_host(registry)
    for entry in _insecure_setting():
        if entry in (registry, host):
            return True
        with contextlib.suppress(ValueError):
            if "/" in entry and ipaddress.ip_address(host) in ipaddress.ip_network(entry, False):
                return True
    return False


def certs_dir(netloc: str) -> Path:
    return Path(os.environ.get("BUILDER_CERTS_D") or CERTS_D) / netloc


def tls_context(netloc: str) -> ssl.SSLContext:
    """The system store + `$BUILDER_CA_BUNDLE` + Docker's certs.d folder of `netloc`."""
    context = ssl.create_default_context()
    if (bundle := settings.current().ca_bundle) and os.path.isfile(bundle):
        context.load_verify_locations(cafile=bundle)
    folder = certs_dir(netloc)
    if folder.is_dir():
        for ca in sorted(folder.glob("*.crt")):
            context.load_verify_locations(cafile=str(ca))
        for cert in sorted(folder.glob("*.cert")):
            key = cert.with_suffix(".key")
            if not key.is_file():
                raise RegistryError(f"{cert}: client certificate without its key {key.name}")
            context.load_cert_chain(str(cert), str(key))
    return context


_POOLS: dict[str, urllib3.PoolManager] = {}


def pool(netloc: str) -> urllib3.PoolManager:
    """One pool manager per host, with that host's TLS settings (a client certificate for the
    registry never goes to the blob store it redirects to)."""
    if netloc not in _POOLS:
        manager = urllib3.PoolManager(ssl_context=tls_context(netloc), retries=False, maxsize=4)
        manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        _POOLS[netloc] = manager
    return _POOLS[netloc]


def forget_pools() -> None:
    """Drop every host's pool (tests; a changed TLS configuration)."""
    _POOLS.clear()
