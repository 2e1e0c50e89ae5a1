"""`build --stage --verify-reproducible` (flows/same_again.py): the option reaches the build,
is refused without --stage, and an image is staged only when a build with no cache at all gives
the same id."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder import cli
from builder.commands import build as build_cmd
from builder.core import layerdiff
from builder.core.errors import BuilderError, UsageError
from builder.flows import build as flow
from builder.flows import same_again
from builder.stages import build

SAME, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def options(*argv: str) -> flow.BuildOptions:
    args = cli.build_parser("build").parse_args(["build", *argv])
    return build_cmd.build_options(args)


def test_the_option_reaches_the_build_only_with_stage() -> None:
    assert options("--stage", "--verify-reproducible").verify_reproducible is True
    assert options("--stage").verify_reproducible is False
    with pytest.raises(UsageError, match="--verify-reproducible without --stage"):
        options("--verify-reproducible")


def test_the_step_runs_before_staging() -> None:
    assert flow.STEPS.index(flow.same_again) == flow.STEPS.index(flow.stage) - 1


@pytest.fixture
def spec(tmp_path: Path) -> build.Spec:
    return build.Spec(key="2.13.0-py3.11-cpu-runtime", image="reg/torch:2.13.0-py3.11-cpu-runtime",
                      platform="linux/amd64", labels={}, context=tmp_path,
                      dockerfile=tmp_path / "Dockerfile", log=tmp_path / "build.log")


def rebuilt_as(monkeypatch: pytest.MonkeyPatch, image_id: str) -> dict[str, list]:
    """The cache-free build gives `image_id`; returns what was built and removed."""
    seen: dict[str, list] = {"built": [], "removed": []}

    def docker_build(spec: build.Spec, cache_from: list[str] | None = None) -> str:
        seen["built"].append(spec)
        return "sha256:" + "0" * 64

    monkeypatch.setattr(build, "docker_build", docker_build)
    monkeypatch.setattr(same_again.reproducible, "normalise_image", lambda _i, _ref: image_id)
    monkeypatch.setattr(same_again.engine, "remove_image", seen["removed"].append)
    return seen


def test_the_same_id_again_passes_and_nothing_is_left(monkeypatch, spec, capsys) -> None:
    seen = rebuilt_as(monkeypatch, SAME)
    same_again.check(spec, SAME)
    [again] = seen["built"]
    assert again.no_cache and again.image == f"{spec.image}-again" and again.log != spec.log
    assert seen["removed"] == [f"{spec.image}-again"]
    assert "reproducible: a cache-free rebuild gives the same image" in capsys.readouterr().err


def test_another_id_is_refused_naming_the_first_layer_that_differs(monkeypatch, spec) -> None:
    seen = rebuilt_as(monkeypatch, OTHER)
    rows = [layerdiff.LayerRow(index=0, a="sha256:1", b="sha256:1", size=1, step="FROM"),
            layerdiff.LayerRow(index=4, a="sha256:2", b="sha256:3", size=1,
                               step="RUN uv pip install", paths=("opt/venv/x.pyc",))]
    monkeypatch.setattr(layerdiff, "saved", lambda *_i: contextlib.nullcontext(None))
    monkeypatch.setattr(layerdiff, "compare", lambda *_a: rows)
    with pytest.raises(BuilderError) as caught:
        same_again.check(spec, SAME)
    assert str(caught.value) == (
        f"{spec.key}: not reproducible: a cache-free rebuild gives {OTHER[:19]}, not "
        f"{SAME[:19]} (1 layers differ): layer 4 (`RUN uv pip install`) differs, first paths "
        "opt/venv/x.pyc")
    assert "nothing was staged or signed" in (caught.value.hint or "")
    assert seen["removed"] == [f"{spec.image}-again"]


def test_the_step_fails_the_variant_and_skips_other_states(monkeypatch, spec) -> None:
    monkeypatch.setattr(flow, "spec_of", lambda _r, _o: spec)
    monkeypatch.setattr(flow.same_again_check, "check", lambda _s, _i: (_ for _ in ()).throw(
        BuilderError("not reproducible")))
    run = SimpleNamespace(options=flow.BuildOptions(stage=True, verify_reproducible=True))
    built = flow.Outcome(variant_id="v", state="built", image_id=SAME)
    assert flow.same_again(run, built).state == "failed"  # type: ignore[arg-type]
    assert flow.same_again(run, replace(built, state="up-to-date")).state == "up-to-date"  # type: ignore[arg-type]
    run.options = flow.BuildOptions(stage=True)
    assert flow.same_again(run, built) == built  # type: ignore[arg-type]
