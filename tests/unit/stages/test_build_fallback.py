"""A build from the registry's cache that Docker 20.10 cannot export runs again without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import CommandFailed
from builder.stages import build

LAZY = ("#17 ERROR: failed to get layer sha256:e7a1ed1f9e5a: layer does not exist\n"
        "failed to get layer sha256:e7a1ed1f9e5a: layer does not exist\n")


def fake_builds(monkeypatch, tmp_path: Path, failures: list[str]) -> list[list[str]]:
    """docker_build fails with each text of `failures` in turn (written to the log), then
    succeeds; returns the cache_from of every call."""
    calls: list[list[str]] = []

    def docker_build(spec, cache_from=None):
        calls.append(list(cache_from or []))
        if len(calls) <= len(failures):
            spec.log.write_text(failures[len(calls) - 1])
            raise CommandFailed("`docker build` exited 1")
        return "sha256:" + "a" * 64

    monkeypatch.setattr(build, "docker_build", docker_build)
    return calls


def run(tmp_path: Path, cache_from: list[str]) -> str:
    spec = build.Spec(key="2.15.0-py3.11-cuda-runtime", image="img", platform="linux/amd64",
                      labels={}, context=tmp_path, dockerfile=tmp_path / "Dockerfile",
                      log=tmp_path / "build.log")
    return build.build_from_registry_cache(spec, cache_from)


def test_a_lazy_layer_export_failure_is_retried_with_the_cache(monkeypatch, tmp_path, capsys):
    calls = fake_builds(monkeypatch, tmp_path, [LAZY])
    assert run(tmp_path, ["reg/torch-staging:cache-x"]) == "sha256:" + "a" * 64
    assert calls == [["reg/torch-staging:cache-x"], ["reg/torch-staging:cache-x"]]
    assert "building again with it" in capsys.readouterr().err


def test_twice_and_the_build_runs_without_the_cache(monkeypatch, tmp_path, capsys):
    calls = fake_builds(monkeypatch, tmp_path, [LAZY, LAZY])
    assert run(tmp_path, ["reg/torch-staging:cache-x"]) == "sha256:" + "a" * 64
    assert calls == [["reg/torch-staging:cache-x"]] * 2 + [[]]
    assert "building again without it" in capsys.readouterr().err


def test_any_other_failure_is_not_retried(monkeypatch, tmp_path):
    calls = fake_builds(monkeypatch, tmp_path, ["E: Unable to locate package g++\n"])
    with pytest.raises(CommandFailed):
        run(tmp_path, ["reg/torch-staging:cache-x"])
    assert len(calls) == 1


def test_without_a_cache_the_failure_stands(monkeypatch, tmp_path):
    calls = fake_builds(monkeypatch, tmp_path, [LAZY])
    with pytest.raises(CommandFailed):
        run(tmp_path, [])
    assert len(calls) == 1


def test_a_failure_without_the_cache_is_not_hidden(monkeypatch, tmp_path):
    calls = fake_builds(monkeypatch, tmp_path, [LAZY, LAZY, LAZY])
    with pytest.raises(CommandFailed):
        run(tmp_path, ["reg/torch-staging:cache-x"])
    assert len(calls) == 3
