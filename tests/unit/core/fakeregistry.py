"""A scriptable registry on a loopback port for unit tests: routes are (method, path regex) →
handler(request, match); every request is logged with its headers. Connections may go to
loopback addresses only (the unit-test fixture refuses all others)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from builder.core import registry_http

REAL_CONNECT = socket.socket.connect
REAL_CREATE = socket.create_connection


def _loopback_only(sock: socket.socket, address: Any) -> Any:
    host = address[0] if isinstance(address, tuple) else str(address)
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise AssertionError(f"a unit test tried to connect to {address!r}")
    return REAL_CONNECT(sock, address)


def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
    monkeypatch.setattr(socket, "create_connection", REAL_CREATE)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[["Request", "re.Match[str]"], None]


class Request(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        seen = Seen(self.command, self.path, dict(self.headers), b"")
        self.server.seen.append(seen)
        if self.server.gate is not None and self.path != "/v2/" and not self.server.gate(self):
            return
        for method, pattern, handler in self.server.routes:
            if method == self.command and (m := re.fullmatch(pattern, self.path)):
                handler(self, m)
                return
        self.reply(404, b'{"errors":[{"code":"NOT_FOUND"}]}')

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Request)
        self.routes: list[tuple[str, str, Handler]] = []
        self.seen: list[Seen] = []
        # Asked before the routes (the ping aside): False when it answered (a 401) itself.
        self.gate: Callable[[Request], bool] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def route(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        def add(fn: Handler) -> Handler:
            self.routes.append((method, pattern, fn))
            return fn
        return add

    def ping_ok(self) -> None:
        self.route("GET", "/v2/")(lambda r, m: r.reply(200, b"{}"))


@dataclass
class Store:
    """Manifests and blobs a fake registry serves honestly."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    def add_blob(self, data: bytes) -> str:
        self.blobs[digest(data)] = data
        return digest(data)

    def add_manifest(self, doc: dict[str, Any], *tags: str) -> str:
        body = json.dumps(doc).encode()
        for ref in (digest(body), *tags):
            self.manifests[ref] = (body, doc["mediaType"])
        return digest(body)

    def serve(self, server: Server, repository: str = "repo") -> None:
        @server.route("GET", rf"/v2/{repository}/manifests/([^/]+)")
        @server.route("HEAD", rf"/v2/{repository}/manifests/([^/]+)")
        def manifest(r: Request, m: re.Match[str]) -> None:
            if m.group(1) not in self.manifests:
                r.reply(404)
                return
            body, media_type = self.manifests[m.group(1)]
            r.reply(200, body, {"Content-Type": media_type,
                                "Docker-Content-Digest": digest(body)})

        @server.route("GET", rf"/v2/{repository}/blobs/([^/]+)")
        @server.route("HEAD", rf"/v2/{repository}/blobs/([^/]+)")
        def blob(r: Request, m: re.Match[str]) -> None:
            data = self.blobs.get(m.group(1))
            r.reply(404) if data is None else r.reply(200, data)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    allow_loopback(monkeypatch)
    monkeypatch.setenv("BUILDER_CERTS_D", "/nonexistent")
    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    monkeypatch.delenv("REGISTRY_USERNAME", raising=False)
    monkeypatch.delenv("REGISTRY_PASSWORD", raising=False)
    registry_http.forget()
    with serving() as server:
        yield server
    registry_http.forget()


@contextlib.contextmanager
def serving() -> Iterator[Server]:
    server = Server()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
