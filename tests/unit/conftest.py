"""Unit tests run in seconds and touch nothing: no engine, no network, no commands, no writes
into the checkout. Anything that tries fails the test, naming what it tried."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.core import engine


class Forbidden(AssertionError):
    pass


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        shown = args[0] if args else kwargs.get("args", "")
        raise Forbidden(f"a unit test tried to {what}: {shown!r} (move it to tests/e2e)")
    return refuse


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.ensure_engine.cache_clear()  # an engine found by an e2e test earlier is not ours
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("BUILDER_TWIN_CACHE", str(tmp_path / "twins"))  # never the user's
    monkeypatch.setattr(subprocess, "Popen", _refuse("run a command"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("open a connection"))
    monkeypatch.setattr(socket, "create_connection", _refuse("open a connection"))
