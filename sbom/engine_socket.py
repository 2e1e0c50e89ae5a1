"""The local engine's API over its unix socket: an image's inspect and a container's export.

One request on the socket answers what the CLI would need two processes for (`docker info`, then
`inspect`), and streams an export faster than the `docker export` pipe; every other address
(tcp with TLS, ssh) goes through the CLI (builder.core.engine).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

from builder.core import engine
from builder.core.errors import EngineError
from sbom.tarstream import Readable


def inspect_image(image_ref: str) -> dict[str, Any] | None:
    """`docker image inspect` of a local image, None when absent.

    A local engine is asked over its unix socket (the same JSON, without starting the CLI twice
    for `docker info` and `inspect`: 0.2 s on a busy host); other addresses through the CLI.
    """
    address = engine.engine_address()
    if not address.startswith("unix://"):
        engine.ensure_engine()
        return engine.inspect_image(image_ref)
    conn = _UnixHTTPConnection(address.removeprefix("unix://"))
    try:
        conn.request("GET", f"/images/{urllib.parse.quote(image_ref, safe='/:@')}/json")
        response = conn.getresponse()
        body = response.read()
    except OSError as exc:
        raise EngineError(f"cannot reach the Docker engine at {address}: {exc}",
                          hint="start dockerd or set DOCKER_HOST") from exc
    finally:
        conn.close()
    if response.status == 404:
        return None
    if response.status != 200:
        raise EngineError(f"cannot inspect image `{image_ref}`: HTTP {response.status} "
                          + body[:2000].decode(errors="replace"))
    info: dict[str, Any] = json.loads(body)
    return info



@contextlib.contextmanager
def export_stream(container: str) -> Iterator[Readable]:
    """The container's filesystem as a tar byte stream.

    A local engine is asked over its unix socket with http.client, which decodes the chunked
    body with `readinto` (no copies): about 310 MB/s here, against 240 MB/s for the `docker
    export` pipe, which serves every other address the CLI reaches (tcp with TLS, ssh).
    """
    address = engine.engine_address()
    if not address.startswith("unix://"):
        with engine.export(container) as stream:
            yield stream
        return
    conn = _UnixHTTPConnection(address.removeprefix("unix://"))
    try:
        conn.request("GET", f"/containers/{container}/export")
        response = conn.getresponse()
    except OSError as exc:
        raise EngineError(f"cannot export container `{container}` via {address}: {exc}") from exc
    try:
        if response.status != 200:
            detail = response.read(2000).decode(errors="replace")
            raise EngineError(
                f"cannot export container `{container}`: HTTP {response.status} {detail}")
        yield response
    finally:
        conn.close()


class _BigBufferResponse(http.client.HTTPResponse):
    """Reads the socket in 1 MiB pieces (the default 8 KiB means a syscall per few members)."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = sock.makefile("rb", buffering=1 << 20)


class _UnixHTTPConnection(http.client.HTTPConnection):
    response_class = _BigBufferResponse

    def __init__(self, socket_path: str) -> None:
        super().__init__("localhost", timeout=600)
        self._socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._socket_path)
