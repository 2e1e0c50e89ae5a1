"""bench/containerds.py: the Go release read from a binary's build info, the daemon's PATH,
and a folder that lacks a binary refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import containerds
from bench.varint import varint
from builder.core.errors import BuilderError


def go_binary(path: Path, version: bytes, flags: int = 2) -> Path:
    """An ELF-ish file with Go ≥ 1.18's build info header (magic, pointer size, flags, padding
    to 32 bytes, then the version as a varint-prefixed string)."""
    header = containerds.GO_BUILDINFO + bytes([8, flags]) + bytes(16)
    path.write_bytes(b"\x7fELF" + bytes(4093) + header + varint(len(version)) + version
                     + b"\x00mod\tgithub.com/containerd/containerd")
    return path


def test_the_go_release_is_read_from_the_build_info(tmp_path: Path) -> None:
    assert containerds.go_version(go_binary(tmp_path / "a", b"go1.24.4")) == "go1.24.4"
    assert containerds.go_version(go_binary(tmp_path / "b", b"go1.19.8")) == "go1.19.8"
    assert containerds.go_version(go_binary(tmp_path / "c", b"go1.17", flags=0)) == "unknown"
    (tmp_path / "d").write_bytes(b"#!/bin/sh\n")
    assert containerds.go_version(tmp_path / "d") == "unknown"


def test_the_daemon_finds_its_own_shim_first_and_the_rest_as_before(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    node = containerds.Containerd(name="x", containerd="/c/containerd", ctr="/c/ctr",
                                  bin_dir="/c", version="1.7", go="go1.24.4", source="t")
    assert node.env()["PATH"] == "/c:/usr/bin:/bin"
    assert dataclasses.replace(node, bin_dir="").env()["PATH"] == "/usr/bin:/bin"


def test_a_folder_without_the_three_binaries_is_refused(tmp_path: Path) -> None:
    (tmp_path / "containerd").write_text("")
    (tmp_path / "containerd").chmod(0o755)
    with pytest.raises(BuilderError, match=r"no executable `.*/ctr`") as caught:
        containerds.resolve(str(tmp_path / "containerd"), tmp_path / "cache")
    assert "containerd-shim-runc-v2" in caught.value.hint
    with pytest.raises(BuilderError, match="no such folder"):
        containerds.resolve(str(tmp_path / "absent"), tmp_path / "cache")


def test_no_unpigz_sets_containerds_own_switch_and_says_so(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("CONTAINERD_DISABLE_PIGZ", "1")  # the bench's, not the node's choice
    monkeypatch.setattr(containerds, "system", lambda: containerds.Containerd(
        name="system", containerd="/usr/bin/containerd", ctr="/usr/bin/ctr", bin_dir="",
        version="1.6", go="go1.19.8", source="t"))
    plain = containerds.resolve("system", tmp_path)
    off = containerds.resolve("system:no-unpigz", tmp_path)
    assert "CONTAINERD_DISABLE_PIGZ" not in plain.env()
    assert (off.name, off.unpigz, off.env()["CONTAINERD_DISABLE_PIGZ"]) == (
        "system:no-unpigz", False, "1")
    monkeypatch.setattr(containerds.shutil, "which", lambda *_a, **_k: "/usr/bin/unpigz")
    assert (plain.facts()["unpigz"], off.facts()["unpigz"]) == ("/usr/bin/unpigz", "disabled")
