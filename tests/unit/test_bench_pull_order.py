"""bench/pull.py's run order and choice of run: gzip and zstd take turns going first, and the
kept run is the least of the figure asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import containerds, pull
from builder.core.errors import BuilderError


def test_gzip_and_zstd_take_turns_going_first() -> None:
    order: list[tuple[str, int]] = []
    timings = pull.alternating(3, lambda kind, n: order.append((kind, n)) or {"s": n})
    assert order == [("gzip", 0), ("zstd", 0), ("zstd", 1), ("gzip", 1), ("gzip", 2),
                     ("zstd", 2)]
    assert timings == {"gzip": [{"s": 0}, {"s": 1}, {"s": 2}],
                       "zstd": [{"s": 0}, {"s": 1}, {"s": 2}]}


def test_best_keeps_the_least_of_the_figure_asked_for_and_every_run() -> None:
    runs = [{"s": 1.0, "to_matmul_s": 9.0}, {"s": 2.0, "to_matmul_s": 3.0}]
    assert pull.best(runs) == {**runs[0], "runs": runs}
    assert pull.best(runs, key="to_matmul_s") == {**runs[1], "runs": runs}


def test_a_default_containerd_that_cannot_be_had_is_skipped_a_named_one_is_not(
        monkeypatch, tmp_path) -> None:
    """sid on a frozen mirror: the default run measures the others and says why; asked for by
    name, it stops the run in one line."""
    said: list[str] = []

    def resolve(spec: str, cache: Path, allow_expired: bool) -> containerds.Containerd:
        if spec == "debian-sid":
            raise BuilderError("`InRelease`: expired (Valid-Until x)", hint="h")
        return containerds.Containerd(spec, "c", "ctr", "", "v", "go", "s")
    monkeypatch.setattr(containerds, "resolve", resolve)
    monkeypatch.setattr(pull, "log", said.append)
    nodes = pull.measured(None, tmp_path, False)
    assert [n.name for n in nodes] == [s for s in pull.DEFAULT_CONTAINERDS if s != "debian-sid"]
    assert said == ["containerd `debian-sid` skipped: `InRelease`: expired (Valid-Until x) (h)"]
    with pytest.raises(BuilderError, match="expired"):
        pull.measured(["system", "debian-sid"], tmp_path, False)


class Registry:
    def manifest(self, repository: str, ref: str) -> tuple[bytes, None]:
        assert (repository, ref) == (pull.REPO, "zstd")
        return json.dumps({"config": {"digest": "sha256:" + "c" * 64},
                           "layers": [{"digest": "sha256:ab" + "1" * 62}]}).encode(), None


def test_the_registry_serves_an_image_from_its_blob_files(tmp_path) -> None:
    blobs = tmp_path / "docker" / "registry" / "v2" / "blobs" / "sha256"
    assert pull.served_blobs(Registry(), "zstd", tmp_path) == [  # type: ignore[arg-type]
        blobs / "cc" / ("c" * 64) / "data", blobs / "ab" / ("ab" + "1" * 62) / "data"]
