"""What a build run reports per variant: a platform without emulation is skipped in one line while
the others build, the smoke summary says what stood in and what failed, an up-to-date image
without evidence gets it, the source label is a public URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matrix_files import CPU, LOCKS, ROOT

from builder.commands import build as build_cmd
from builder.core import labels, state
from builder.flows import build as build_flow
from builder.model import matrix, platforms, smokereport
from builder.stages import build, smoketest

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
    monkeypatch.setattr(build_flow, "already_built", lambda *_: None)  # nothing built yet
    monkeypatch.setattr(build_flow.bases, "ensure",
                        lambda _m, v, _options, progress: made.append(f"base {v.platform}"))

    def build_step(_run, o):
        made.append(f"build {o.planned.variant.platform}")
        return build_flow.Outcome(variant_id=o.variant_id, state="built")

    monkeypatch.setattr(build_flow, "STEPS", (build_step,))
    options = build_flow.BuildOptions(locks=LOCKS, smoke=False, sbom=False)
    outcomes = build_flow.build_images(m, both, options)
    assert made == ["base linux/amd64", "build linux/amd64"]
    assert [(o.variant_id, o.state) for o in outcomes] == [
        ("2.15.0-py3.11-cuda-slim", "built"), ("2.15.0-py3.11-cuda-slim.linux-arm64", "skipped")]
    assert outcomes[1].message == "no emulation: tools/setup_emulation.sh"
    assert f"linux/arm64: 1 variant skipped: {ARM_HINT}\n" in capsys.readouterr().err
    assert build_cmd.exit_status(outcomes) == 2


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
    assert smokereport.summary({"status": status, "checks": checks}) == shown
    assert smokereport.summary(None) == "-"


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

    monkeypatch.setattr(build_flow.engine, "inspect_image", lambda ref: {"Id": image_id})
    monkeypatch.setattr(smoketest, "run_smoke", smoke)
    monkeypatch.setattr(smokereport, "report_passed", lambda report, require_gpu: (True, ""))
    monkeypatch.setattr(build_flow, "write_image_sbom", describe)
    run = build_flow.Run(None, build_flow.BuildOptions(locks=LOCKS), None)  # type: ignore[arg-type]
    found = build_flow.Outcome(variant_id=CPU, state="up-to-date", image="127.0.0.1:5000/torch:x", message="local")
    outcome = build_flow.through_steps(run, found)
    assert made == ["smoke", "sbom"]
    assert (outcome.state, outcome.smoke, outcome.sbom_components) == ("up-to-date", "pass", 3)
    again = build_flow.through_steps(run, found)
    assert made == ["smoke", "sbom"]  # the second run finds both: nothing is made twice
    assert (again.smoke, again.sbom_components) == ("pass", 3)
    assert again.as_json()["smoke"] == "pass" and again.as_json()["sbom_components"] == 3


@pytest.mark.parametrize(("remote", "url"), [
    ("/work/main", ""),
    ("git@github.com:org/torch-images.git", "https://github.com/org/torch-images"),
    ("https://user:token@github.com/org/torch-images.git", "https://github.com/org/torch-images"),
])
def test_source_label_is_a_public_url_never_a_local_path(remote, url):
    assert build.public_url(remote) == url


def test_an_arm64_build_takes_its_base_by_the_verified_digest_and_is_removed_off_it(
        monkeypatch, tmp_path):
    """The buildkit step gives BuildKit the base's verified reference (BASE_IMAGE); an image
    whose first layer is not that base's anyway fails and loses its tags, so that no later run
    finds it up to date by its content hash."""
    from builder.stages import plan, render

    monkeypatch.setenv("BUILDER_STATE", str(tmp_path))
    m = matrix.load(ROOT / "matrix.yaml")
    [v] = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])
    verified = "sha256:" + "a" * 64
    p = plan.plan_variant(m, render.render_locked(m, v, LOCKS),
                          platforms.layers_digest([verified]), "smoke")
    pin = "127.0.0.1:5000/torch-base@sha256:" + "d" * 64
    given, removed = [], []
    monkeypatch.setattr(build, "build_labels", lambda *a: {})
    monkeypatch.setattr(build, "build_from_registry_cache",
                        lambda spec, cache: given.append(spec.base_image) or "sha256:built")
    monkeypatch.setattr(build_flow.reproducible, "normalise_image", lambda i, ref, keep: i)
    layers = [["sha256:" + "c" * 64]]
    monkeypatch.setattr(build_flow.engine, "inspect_image",
                        lambda ref: {"Id": ref, "Size": 1, "RootFS": {"Layers": layers[0]}})
    monkeypatch.setattr(build_flow.engine, "remove_image", removed.append)
    run = build_flow.Run(m, build_flow.BuildOptions(locks=LOCKS), build_flow.Wheelhouse(),
                         {platforms.base_key(v.base.image, v.platform): pin})

    def through() -> build_flow.Outcome:
        return build_flow.buildkit(run, build_flow.Outcome(variant_id=v.key, state="build", image=p.local_image,
                                                           planned=p))
    o = through()
    assert given == [pin]
    assert o.state == "failed" and "built on another base than the verified one" in o.message
    assert removed == [p.local_image, build.cache_ref(m, p.local_image)]
    layers[0] = [verified, "sha256:" + "b" * 64]
    assert through().state == "built"
    run = build_flow.Run(m, build_flow.BuildOptions(locks=LOCKS), build_flow.Wheelhouse())
    unpinned = through()  # no verified reference: never built FROM the floating tag
    assert unpinned.state == "failed" and "no verified base reference" in unpinned.message
    assert given == [pin, pin]


def test_a_dirty_checkout_is_labelled_dirty_with_a_hash_of_its_difference(monkeypatch):
    answers = {("status", "--porcelain"): " M locks/x.txt",
               ("diff", "HEAD", "--binary"): "diff --git a/locks/x.txt b/locks/x.txt",
               ("ls-files", "--others", "--exclude-standard"): ""}
    monkeypatch.setattr(build, "git", lambda *args: answers[args])
    found = build.tree_labels()
    assert found[labels.SOURCE_DIRTY] == "true"
    assert found[labels.SOURCE_DIFF].startswith("sha256:")
    answers[("diff", "HEAD", "--binary")] += "\n+numpy==2.4.6"
    assert build.tree_labels()[labels.SOURCE_DIFF] != found[labels.SOURCE_DIFF]
    answers[("status", "--porcelain")] = ""
    assert build.tree_labels() == {labels.SOURCE_DIRTY: "false"}
