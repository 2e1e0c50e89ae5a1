"""Issue #25 "Hostile inputs, round two": one test (or a few) per numbered case that needs no
engine. Case 1 (render's swap): tests/unit/stages/test_render_interrupted.py; cases 2, 9 and
10 need processes: tests/e2e/test_hostile_round_two_e2e.py."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

import pytest

from builder import cli
from builder.commands import build as build_cmd
from builder.commands import sbom as sbom_cmd
from builder.core import output, proc, state
from builder.core.errors import BuilderError, GateRefused
from builder.flows import publish as publish_flow
from builder.model import matrix, matrix_expand, platforms, publication
from builder.stages import build, plan, publish, render, smoketest

ROOT = Path(__file__).resolve().parents[3]
LOCKS = ROOT / "locks"
CPU = "2.13.0-py3.11-cpu-runtime"
SLIM = "2.13.0-py3.11-cpu-slim"


@pytest.fixture(scope="module")
def shipped_plan() -> tuple[matrix.Matrix, list[plan.PlannedVariant]]:
    m = matrix.load(ROOT / "matrix.yaml")
    rendered = [render.render_locked(m, m.variant(vid), LOCKS) for vid in (CPU, SLIM)]
    return m, plan.make_plan(m, rendered, {}, check_registry=False)


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand-ins for the engine and the per-variant publication: what would have been pushed."""
    pushed: list[str] = []

    def publish_group(_m, group, **_kw):
        [p] = group
        pushed.append(p.variant.id)
        if p.variant.id == SLIM:
            raise publish.RegistryError("the registry went away")
        return [{"id": p.variant.id, "status": "published", **RECORD}]

    monkeypatch.setattr(publish_flow.engine, "ensure_engine", lambda: None)
    monkeypatch.setattr(publish_flow, "publish_group", publish_group)
    monkeypatch.setattr(publish_flow.record, "latest", lambda *_a: {})  # nothing published yet
    return pushed


RECORD = {"date": "2026-12-04", "published_at": "2026-12-04T00:00:00Z",
          "registry": "127.0.0.1:5000", "repository": "torch", "digest": "sha256:" + "a" * 64,
          "reference": "127.0.0.1:5000/torch@sha256:" + "a" * 64, "image_id": "sha256:" + "b" * 64,
          "content_hash": "c" * 64, "tags": ["t-20261204", "build-" + "d" * 20, "t"],
          "dated_tag": "t-20261204", "hash_tag": "build-" + "d" * 20, "floating_tag": "t", "aliases": [],
          "torch": "2.13.0+cpu", "python": "3.11", "accelerator": "cpu", "cuda": None,
          "cudnn": None, "nccl": None, "min_driver": None, "flavor": "runtime",
          **{kind: {"tag": f"sha256-{'a' * 64}.{kind}", "digest": "sha256:" + "e" * 64,
                    "media_type": "application/json",
                    "reference": "127.0.0.1:5000/torch@sha256:" + "e" * 64}
             for kind in ("sbom", "smoke_report", "provenance")},
          "smoke_gpu": False,
          "allow_cpu_smoke": False}


# ---- 3. publish reads and checks its record before the first push -----------------------------


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not JSON"),
    ('{"schema_version": 1}', "'variants' is a required property"),
    (None, "is a folder"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_bad_record_stops_publish_before_any_push(tmp_path, shipped_plan, pushes, content,
                                                    message, dry_run):
    m, planned = shipped_plan
    manifest = tmp_path / "published.json"
    if content is None:
        manifest.mkdir()
    else:
        manifest.write_text(content)
    with pytest.raises(BuilderError, match=message):
        publish_flow.publish_variants(m, planned, allow_cpu_smoke=True, dry_run=dry_run,
                                   manifest=manifest, locks_dir=LOCKS)
    assert pushes == []


def test_a_variant_is_recorded_as_soon_as_it_is_published(tmp_path, shipped_plan, pushes):
    """The first variant's record is on disk although the second fails (and stays there when
    the run is stopped later)."""
    m, planned = shipped_plan
    manifest = tmp_path / "published.json"
    with pytest.raises(publish.RegistryError, match="went away"):
        publish_flow.publish_variants(m, planned, allow_cpu_smoke=True, manifest=manifest,
                                   locks_dir=LOCKS)
    assert pushes == [CPU, SLIM]
    assert list(publication.load_document(manifest)["variants"]) == [CPU]


# ---- 6. one JSON document; a closed stdout ends quietly ---------------------------------------


def test_json_prints_one_document_when_the_command_fails_after_its_results(monkeypatch, capsys):
    """`publish --dry-run --json` with nothing staged: the results (with the refusals), then the
    GateRefused; stdout is still one document."""

    def refuse(_args: argparse.Namespace) -> int:
        output.emit_json([{"id": CPU, "status": "refused", "reason": "not staged"}])
        raise GateRefused("1 of 1 images refused: " + CPU, printed=True)

    args = argparse.Namespace(func=refuse, json=True, debug=False)
    assert cli.run(args) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["status"] == "refused"
    assert f"error: 1 of 1 images refused: {CPU}" in err


def test_a_closed_stdout_ends_quietly_with_141(monkeypatch, capsys):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head`) is gone before anything is written
    monkeypatch.setattr(sys, "stdout", os.fdopen(write_end, "w"))
    monkeypatch.setattr(proc, "install_signal_handlers", lambda: None)
    code = cli.main(["validate", "--json", "--offline", "--matrix", str(ROOT / "matrix.yaml")])
    assert code == 141
    assert capsys.readouterr().err == ""


# ---- 7. messages instead of "unexpected X … please report it" -----------------------------------


def test_an_sbom_nested_5000_deep_is_a_message(tmp_path):
    deep = tmp_path / "deep.cdx.json"
    deep.write_text('{"bomFormat": "CycloneDX", "components": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(BuilderError, match=r"deep\.cdx\.json` is not JSON: nested deeper than"):
        sbom_cmd._load(deep)
    cand = publish.Candidate(planned=None, image="x", evidence={"sbom": deep.read_bytes()})  # type: ignore[arg-type]
    assert "the SBOM is not JSON: nested deeper than" in publish._sbom_gate(cand)


def test_a_read_only_state_folder_is_a_message_at_the_build_lock(tmp_path, monkeypatch):
    def read_only(self: Path, *args: object, **kwargs: object) -> object:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    state.path()  # the folder exists; only writing into it fails, as on a read-only mount
    monkeypatch.setattr(Path, "open", read_only)
    with (pytest.raises(BuilderError, match=r"cannot write .*build\.lock: Read-only file system"),
          build.build_lock()):
        pass


# ---- 4. one options contract --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["build", "rebuild"])
def test_a_ca_bundle_that_is_not_a_readable_file_is_bad_usage(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser(command).parse_args([command, "--ca-bundle", "/nonexistent"])
    assert exc.value.code == 2
    assert "/nonexistent is not a readable file" in capsys.readouterr().err


def test_an_unknown_select_key_is_bad_usage_with_a_suggestion():
    m = matrix.load(ROOT / "matrix.yaml")
    with pytest.raises(BuilderError) as exc:
        m.select(["flavour=slim"])
    assert exc.value.exit_code == 2
    assert exc.value.hint == "did you mean `flavor`?"


def test_rebuild_check_with_nothing_published_calls_no_source_clean(capsys, monkeypatch):
    from builder.flows import record

    monkeypatch.setattr(record, "latest", lambda *_a: {})  # the registry records nothing
    args = cli.build_parser("rebuild").parse_args([
        "rebuild", "--check", "--json",
        "--matrix", str(ROOT / "matrix.yaml"), "--locks", str(LOCKS)])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "clean" not in doc["sources"].values()
    assert set(doc["sources"].values()) == {"not-asked"}
    assert doc["message"].startswith("nothing checked: the registry records no publication")


# ---- 5. size and time caps on every input -------------------------------------------------------

SHIPPED = (ROOT / "matrix.yaml").read_text()


def load_error(path: Path) -> str:
    with pytest.raises(BuilderError) as exc:
        matrix.load(path)
    return str(exc.value)


def test_a_matrix_larger_than_the_cap_is_refused_without_reading_it_all(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(SHIPPED + "#" * (2 * 1024 ** 2))
    assert load_error(big) == f"{big} is larger than the 1 MiB limit for a matrix"


def test_a_matrix_with_too_many_values_is_refused(tmp_path):
    many = tmp_path / "many.yaml"
    many.write_text(SHIPPED.replace("packages: [numpy]", "packages: [" + "a, " * 110_000 + "a]"))
    assert "more than 100000 values (the limit for a matrix)" in load_error(many)


class Counted(str):
    """An axis value that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_include_merges_by_lookup_not_by_comparing_every_entry_with_every_combination():
    axes = {"torch": [Counted(f"2.{i}") for i in range(40)],
            "python": [Counted(f"3.{i}") for i in range(50)]}
    include = [{"torch": f"2.{i % 40}", "python": f"3.{i % 50}", "packages": [f"p{i}"]}
               for i in range(2000)]
    Counted.compared = 0
    combos, _ = matrix_expand.expand(axes, include, [])
    assert len(combos) == 2000 and combos[0]["packages"] == ["p1800"]
    assert Counted.compared < 10 * (len(combos) + len(include))  # was about 2000 * 2000


def test_axes_and_include_past_their_caps_are_one_problem_each(tmp_path, monkeypatch):
    wide = tmp_path / "wide.yaml"
    wide.write_text(SHIPPED.replace('torch: ["2.5.1", "2.7.1", "2.9.1", "2.15.0"]', "torch: ["
                                    + ", ".join(f'"2.{i}.0"' for i in range(2000)) + "]"))
    assert "axes: the axes make 12000 combinations; the limit is 10000" in load_error(wide)
    monkeypatch.setattr(matrix_expand, "MAX_MERGES", 5)  # include[0] and [1] merge 3 each
    message = load_error(ROOT / "matrix.yaml")
    assert "include[1]: include merges into more than 5 combinations in all" in message


def test_long_values_and_many_problems_are_shortened(tmp_path):
    long = tmp_path / "long.yaml"
    long.write_text(SHIPPED.replace('python: ["3.11", "3.12"]',
                                    'python: ["3.11", "' + "x" * 100_000 + '"]'))
    message = load_error(long)
    assert "(100002 characters) is not allowed here" in message and len(message) < 400
    keys = tmp_path / "keys.yaml"
    keys.write_text(SHIPPED + "".join(f"k{i}: 1\n" for i in range(30_000)))
    message = load_error(keys)
    assert "(30000 problems)" in message and "… and 29950 more problems" in message
    assert len(message) < 20_000  # was 5 MB


# ---- 9. a foreign platform without emulation ----------------------------------------------------

ARM_HINT = ("linux/arm64 needs emulation on this linux/amd64 host: run tools/setup_emulation.sh "
            "(or build on a linux/arm64 host)")


def test_a_platform_without_emulation_is_skipped_in_one_line_and_the_others_build(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(platforms, "BINFMT_MISC", tmp_path / "no-binfmt")  # no qemu handler
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("linux/amd64"))
    m = matrix.load(ROOT / "matrix.yaml")
    both = m.select(["id=2.15.0-py3.11-cuda-slim"])
    assert {v.platform for v in both} == {"linux/amd64", "linux/arm64"}
    made: list[str] = []
    monkeypatch.setattr(build, "ensure_buildkit", lambda: None)
    monkeypatch.setattr(build.base, "ensure_variant",
                        lambda _m, v, progress: made.append(f"base {v.platform}"))
    monkeypatch.setattr(build, "build_variant", lambda _m, p, *_a: (
        made.append(f"build {p.variant.platform}"), build.Outcome(p.variant.key, "built"))[1])
    options = build.BuildOptions(locks=LOCKS, smoke=False, sbom=False)
    outcomes = build.build_images(m, both, options)
    assert made == ["base linux/amd64", "build linux/amd64"]
    assert [(o.variant_id, o.state) for o in outcomes] == [
        ("2.15.0-py3.11-cuda-slim", "built"), ("2.15.0-py3.11-cuda-slim.linux-arm64", "skipped")]
    assert outcomes[1].message == "no emulation: tools/setup_emulation.sh"
    assert f"linux/arm64: 1 variant skipped: {ARM_HINT}\n" in capsys.readouterr().err
    assert build_cmd.exit_status(outcomes) == 2


# ---- 11. the build table says what the smoke test found, and the SBOM's size ----------------------


def check(name: str, status: str, message: str = "") -> dict[str, object]:
    return {"name": name, "status": status, "message": message or name}


NO_GPU = "no GPU visible: /dev/nvidia* is absent (container started without `--gpus all`, …)"


@pytest.mark.parametrize(("status", "checks", "shown"), [
    ("pass", [check("env", "pass"), check("cuda", "skip", NO_GPU),
              *(check(n, "substituted") for n in ("cudnn_conv", "nccl_allreduce", "amp_train"))],
     "pass (3 CPU stand-ins, cuda skipped: no GPU visible)"),
    ("pass", [check("env", "pass"), check("compile", "pass")], "pass"),
    ("fail", [check("env", "pass"), check("cudnn_conv", "fail")], "FAIL: cudnn_conv"),
])
def test_the_smoke_summary_says_what_stood_in_and_what_failed(status, checks, shown):
    assert smoketest.summary({"status": status, "checks": checks}) == shown
    assert smoketest.summary(None) == "-"


# ---- 8. an up-to-date image without evidence gets it -----------------------------------------------


def test_an_up_to_date_image_without_evidence_gets_its_smoke_report_and_sbom(monkeypatch):
    """Another checkout (or a test) built the image under this name; this state folder has no
    smoke report or SBOM for it: `builder build` makes them instead of calling it up to date."""
    image_id = "sha256:" + "1" * 64
    made: list[str] = []

    def smoke(image: str, **_kw: object) -> dict[str, object]:
        made.append("smoke")
        report = {"status": "pass", "checks": [check("env", "pass")]}
        state.atomic_write(state.evidence_path("smoke", image_id), json.dumps(report))
        return report

    def describe(_image_id: str, _image: str) -> Path:
        made.append("sbom")
        state.atomic_write(state.evidence_path("sbom", image_id), json.dumps({"components": [{}, {}, {}]}))
        return state.evidence_path("sbom", image_id)

    monkeypatch.setattr(build.engine, "inspect_image", lambda ref: {"Id": image_id})
    monkeypatch.setattr(smoketest, "run_smoke", smoke)
    monkeypatch.setattr(smoketest, "report_passed", lambda report, require_gpu: (True, ""))
    monkeypatch.setattr(build, "write_image_sbom", describe)
    options = build.BuildOptions(locks=LOCKS)
    found = build.Outcome(CPU, "up-to-date", "127.0.0.1:5000/torch:x", message="local")
    outcome = build.summarized(build.complete_evidence(found, options))
    assert made == ["smoke", "sbom"]
    assert (outcome.state, outcome.smoke, outcome.sbom_components) == ("up-to-date", "pass", 3)
    again = build.summarized(build.complete_evidence(found, options))
    assert made == ["smoke", "sbom"]  # the second run finds both: nothing is made twice
    assert (again.smoke, again.sbom_components) == ("pass", 3)
    assert again.as_json()["smoke"] == "pass" and again.as_json()["sbom_components"] == 3
