"""Evidence by image id: a build that gives an image id this state folder already holds a
passing smoke report and an SBOM for (a reproducible rebuild after `docker image rm`) reuses
them and says so, and so does `rebuild`, which forces the build; --resmoke (which `builder
build --force` asks for) makes them again; a report that would not pass this run (failed, or
made without a GPU under --require-gpu) is made again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matrix_files import CPU, LOCKS

from builder import cli
from builder.commands import build as build_command
from builder.core import state
from builder.flows import build as build_flow
from builder.model import smokereport
from builder.stages import smoketest

IMAGE_ID = "sha256:" + "2" * 64
IMAGE = "127.0.0.1:5000/torch:x"


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the smoke and SBOM steps ran (each stores its evidence by image id, as the real
    ones do); a report passes when its status is `pass` and, under --require-gpu, it says so."""
    runs: list[str] = []

    def smoke(image: str, *, require_gpu: bool, **_kw: object) -> dict[str, object]:
        runs.append("smoke")
        report = {"status": "pass", "require_gpu": require_gpu}
        state.atomic_write(state.evidence_path("smoke", IMAGE_ID), json.dumps(report))
        return report

    def describe(image_id: str, _image: str) -> Path:
        runs.append("sbom")
        state.atomic_write(state.evidence_path("sbom", image_id), '{"components": [{}]}')
        return state.evidence_path("sbom", image_id)

    def passed(report: dict, *, require_gpu: bool) -> tuple[bool, str]:
        ok = report["status"] == "pass" and (report["require_gpu"] or not require_gpu)
        return ok, "" if ok else "smoke failed"

    monkeypatch.setattr(smoketest, "run_smoke", smoke)
    monkeypatch.setattr(build_flow, "write_image_sbom", describe)
    monkeypatch.setattr(smokereport, "report_passed", passed)
    return runs


def run_of(**options: bool) -> build_flow.Run:
    """A run these steps can take (they read neither the matrix nor the wheelhouse)."""
    return build_flow.Run(None, build_flow.BuildOptions(locks=LOCKS, **options), None)  # type: ignore[arg-type]


def built(**options: bool) -> build_flow.Outcome:
    """A new build that gave IMAGE_ID, through the steps after BuildKit's."""
    run, o = run_of(**options), build_flow.Outcome(variant_id=CPU, state="built", image=IMAGE, image_id=IMAGE_ID)
    for each in (build_flow.evidence, build_flow.smoke, build_flow.sbom, build_flow.summarize):
        o = each(run, o)
    return o


def store(report: dict[str, object]) -> None:
    state.atomic_write(state.evidence_path("smoke", IMAGE_ID), json.dumps(report))
    state.atomic_write(state.evidence_path("sbom", IMAGE_ID), '{"components": [{}, {}]}')


def test_a_rebuild_that_gave_the_same_image_id_reuses_its_evidence_and_says_so(made, capsys):
    first = built()
    assert made == ["smoke", "sbom"] and first.reused == ()
    again = built()
    assert made == ["smoke", "sbom"]  # nothing ran a second time
    assert (again.state, again.smoke, again.sbom_components) == ("built", "pass", 1)
    assert again.reused == ("smoke", "sbom") and again.as_json()["reused"] == ("smoke", "sbom")
    err = capsys.readouterr().err
    assert (f"[{CPU}] reused the smoke report and SBOM this state folder holds for image id "
            f"{IMAGE_ID[:19]} (again with --resmoke)") in err


def test_resmoke_makes_the_evidence_again(made):
    store({"status": "pass", "require_gpu": False})
    o = built(resmoke=True)
    assert made == ["smoke", "sbom"] and o.reused == ()


def test_a_forced_build_as_rebuild_asks_reuses_the_evidence_of_the_same_id(made):
    """`rebuild` forces the build (never `up to date`) but not the smoke test: a rebuild that
    gave an image id this state folder has evidence for (a checkout behind the registry
    rebuilding what it published) does not smoke those bytes twice."""
    store({"status": "pass", "require_gpu": False})
    o = built(force=True)
    assert made == [] and o.reused == ("smoke", "sbom")


@pytest.mark.parametrize(("argv", "resmoke"), [((), False), (("--force",), True),
                                               (("--resmoke",), True)])
def test_build_force_on_the_command_line_makes_the_evidence_again(argv, resmoke):
    args = cli.build_parser("build").parse_args(["build", *argv])
    assert build_command.build_options(args).resmoke is resmoke


@pytest.mark.parametrize(("report", "options"), [
    ({"status": "fail", "require_gpu": False}, {}),
    ({"status": "pass", "require_gpu": False}, {"require_gpu": True}),
])
def test_a_report_that_would_not_pass_this_run_is_made_again(made, report, options):
    store(report)
    o = built(**options)
    assert made == ["smoke"] and o.reused == ("sbom",) and o.state == "built"


def test_without_smoke_nothing_is_reused_or_made(made):
    store({"status": "pass", "require_gpu": False})
    o = built(smoke=False, sbom=False)
    assert made == [] and (o.missing, o.reused) == ((), ())


def test_an_up_to_date_image_is_smoked_again_with_resmoke(made, monkeypatch, capsys):
    store({"status": "pass", "require_gpu": False})
    monkeypatch.setattr(build_flow.engine, "inspect_image", lambda ref: {"Id": IMAGE_ID})
    found = build_flow.Outcome(variant_id=CPU, state="up-to-date", image=IMAGE, message="local")
    assert build_flow.through_steps(run_of(), found).reused == () and made == []
    assert build_flow.through_steps(run_of(resmoke=True), found).state == "up-to-date"
    assert made == ["smoke", "sbom"]
    assert "up to date, but --resmoke: making its smoke report and SBOM again" in \
        capsys.readouterr().err
