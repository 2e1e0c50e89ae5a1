"""Issue #17 "Hostile inputs and interrupted runs": one test (or a few) per numbered item.
Item 5 (signals) needs child processes: tests/e2e/test_signals.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from builder import cli
from builder.commands import matrix as matrix_cmd
from builder.commands import registry as registry_cmd
from builder.commands import sbom as sbom_cmd
from builder.core import proc, registry, state, swap
from builder.core.errors import BuilderError, ConfigError
from builder.flows import publish as publish_flow
from builder.model import lockfile, matrix, matrix_expand
from builder.model.matrix_yaml import MatrixError
from builder.model.rendered import Rendered
from builder.stages import build, plan, publish, render

ROOT = Path(__file__).resolve().parents[3]
LOCKS = ROOT / "locks"
SHIPPED = (ROOT / "matrix.yaml").read_text()
CPU = "2.13.0-py3.11-cpu-runtime"
SLIM_TAG = "2.15.0-py3.11-cuda13.2-cudnn9-slim"  # the floating tag of 2.15.0-py3.11-cuda-slim


@pytest.fixture(autouse=True)
def state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))


def shipped_with(tmp_path: Path, old: str, new: str) -> Path:
    assert old in SHIPPED
    path = tmp_path / "matrix.yaml"
    path.write_text(SHIPPED.replace(old, new, 1))
    return path


def validate_args(path: Path, **extra: object) -> argparse.Namespace:
    return argparse.Namespace(**{"matrix": str(path), "select": [], "json": False,
                                 "offline": True, "locks": LOCKS, **extra})


def load_problems(path: Path) -> str:
    with pytest.raises(MatrixError) as exc:
        matrix.load(path)
    return str(exc.value)


# ---- 1. stale locks --------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new", "what"), [
    ("packages: [numpy]", "packages: [numpy, requests]", "packages"),
    ("find_links: [/opt/wheels]}\n  - {torch",
     "find_links: [/opt/other]}\n  - {torch", "find_links"),
])
def test_a_lock_made_from_other_inputs_is_refused(tmp_path, capsys, old, new, what):
    m = matrix.load(shipped_with(tmp_path, old, new))
    v = m.variant(CPU)
    message = f"{LOCKS}/{CPU}.txt is out of date ({what} changed): run builder lock"
    assert lockfile.stale_reason(LOCKS, v) == message
    with pytest.raises(ConfigError, match=r"out of date"):  # plan, build and publish plan first
        plan.plan_variant(m, render.render_locked(m, v, LOCKS), None, "smoke")
    assert matrix_cmd.cmd_validate(validate_args(m.path)) == 1
    assert message in capsys.readouterr().out


def test_build_refuses_a_stale_lock_before_touching_the_engine(tmp_path, monkeypatch):
    path = shipped_with(tmp_path, "packages: [numpy]", "packages: [numpy, requests]")
    monkeypatch.setattr(build, "ensure_buildkit", lambda: pytest.fail("reached the engine"))
    m = matrix.load(path)
    stale = [v for v in m.variants if v.id == CPU]
    with pytest.raises(ConfigError, match=r"\(packages changed\): run builder lock"):
        build.build_images(m, stale, build.BuildOptions(locks=LOCKS))


def test_the_shipped_locks_record_their_inputs():
    m = matrix.load(ROOT / "matrix.yaml")
    for v in m.variants:
        assert lockfile.stale_reason(LOCKS, v) is None, v.id
        meta = json.loads(lockfile.lock_paths(LOCKS, v)[1].read_text())
        assert meta["inputs"] == lockfile.lock_inputs(v)
        assert set(meta["inputs"]) == {"torch", "packages", "index_url", "find_links", "python",
                                       "platform", "resolver"}


# ---- 2. alias tags ---------------------------------------------------------------------------


def test_an_alias_equal_to_another_variants_floating_tag_stops_publish_before_any_push(
        monkeypatch):
    m = matrix.load(ROOT / "matrix.yaml")
    hostile = dataclasses.replace(m, aliases=(
        *m.aliases, matrix.Alias(SLIM_TAG, {"torch": "2.15.0", "python": "3.12",
                                            "flavor": "slim"})))
    problems = plan.tag_problems(hostile, LOCKS)
    assert any(f"tag `{SLIM_TAG}` would be written by 2.15.0-py3.11-cuda-slim (floating)" in p
               for p in problems)

    def no_engine() -> None:
        pytest.fail("publish reached the engine before checking the tags")

    monkeypatch.setattr(publish.engine, "ensure_engine", no_engine)
    with pytest.raises(ConfigError, match="tags collide"):
        publish_flow.publish_variants(hostile, [], allow_cpu_smoke=True, dry_run=True,
                                 manifest=Path("unused.json"), locks_dir=LOCKS)


@pytest.mark.parametrize(("tag", "why"), [
    (SLIM_TAG, "shape of a variant's floating tag"),
    ("latest-runtime-20260101", "shape of a dated tag"),
    ("latest-runtime-20260101.2", "shape of a dated tag"),
    ("build-0123456789abcdef0123", "which content tags use"),
    ("sha256-abc.sbom", "SBOM/smoke tags"),
    ("latest-slim", "alias `latest-slim` is already aliases[0]"),
])
def test_aliases_cannot_take_generated_or_repeated_names(tmp_path, tag, why):
    path = shipped_with(tmp_path, "  - {tag: latest-runtime,", f"  - {{tag: {tag}, torch: \"2.15.0\", "
                        "python: \"3.12\", flavor: slim}\n  - {tag: latest-runtime,")
    assert why in load_problems(path)


# ---- 3. --select with a repeated key ----------------------------------------------------------


def test_a_repeated_select_key_means_any_of():
    m = matrix.load(ROOT / "matrix.yaml")
    chosen = m.select(["flavor=slim", "flavor=runtime", "python=3.11"])
    assert {v.flavor for v in chosen} == {"slim", "runtime"}
    assert all(v.python == "3.11" for v in chosen)
    assert len(chosen) == len(m.select(["flavor=slim", "python=3.11"])) + len(
        m.select(["flavor=runtime", "python=3.11"]))
    assert "any of" in cli.build_parser()._subparsers._group_actions[0].choices[  # type: ignore
        "plan"].format_help()


# ---- 4. registry and repository are part of up-to-date ----------------------------------------


@pytest.mark.parametrize(("old", "new", "state"), [
    ("registry: 127.0.0.1:5000", "registry: 127.0.0.1:5000", "up-to-date"),
    ("registry: 127.0.0.1:5000", "registry: registry.example:5000", "build"),
    ("repository: torch", "repository: team/torch", "build"),
])
def test_up_to_date_means_under_the_configured_name(tmp_path, monkeypatch, old, new, state):
    shipped = matrix.load(ROOT / "matrix.yaml")
    v = shipped.variant(CPU)
    local: dict[str, set[str]] = {}  # the engine's images by content hash, filled below
    monkeypatch.setattr(plan, "engine_available", lambda engine: True)
    monkeypatch.setattr(plan, "local_content_hashes", lambda engine: local)
    before = plan.make_plan(shipped, [render.render_locked(shipped, v, LOCKS)], {}, check_registry=False)[0]
    local[before.content_hash] = {f"127.0.0.1:5000/torch:{before.floating_tag}"}
    m = matrix.load(shipped_with(tmp_path, old, new))
    [p] = plan.make_plan(m, [render.render_locked(m, m.variant(CPU), LOCKS)], {}, check_registry=False)
    assert p.state == state


# ---- 6. unbounded YAML -----------------------------------------------------------------------


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}]\n" for i in range(8))


def test_an_alias_bomb_is_refused_quickly_with_its_line(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(BOMB)
    start = time.monotonic()
    text = load_problems(path)
    assert time.monotonic() - start < 2
    assert "expands the document past" in text and "(anchor at line" in text
    assert f"{path}:" in text


@pytest.mark.parametrize(("text", "expected"), [
    ("a: " + "[" * 20000 + "]" * 20000 + "\n", "nest"),  # libyaml's own limit, or ours
    ("".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v\n",
     "nested deeper than 32 levels"),
    ("registry: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    ("registry: !!python/name:os.system x\n", "the tag `tag:yaml.org,2002:python/name:os.system`"),
    ("? !!python/name:os.system x\n: 1\n", "is not allowed (plain YAML values only)"),
    ("a: &r [*r]\n", "alias *r refers to its own anchor"),
    ("{[a]: 1}\n", "a key must be plain text"),
    ("registry: !!int abc\n", "`abc` is not a valid int"),
])
def test_hostile_yaml_is_a_problem_not_a_traceback(tmp_path, text, expected):
    path = tmp_path / "matrix.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert expected in load_problems(path)


# ---- 7. bad paths ----------------------------------------------------------------------------


def rendered_cpu() -> Rendered:
    m = matrix.load(ROOT / "matrix.yaml")
    v = m.variant(CPU)
    return render.render(m, v, lockfile.require_lock(LOCKS, v))


def test_render_out_a_regular_file_is_a_message(tmp_path):
    out = tmp_path / "out"
    out.write_text("")
    with pytest.raises(BuilderError, match=f"{out} is a file, not a folder"):
        render.write(rendered_cpu(), out)


def test_render_out_unwritable_is_a_message(tmp_path, monkeypatch):
    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", denied)  # root ignores modes: simulate a read-only DIR
    with pytest.raises(BuilderError, match="Permission denied"):
        render.write(rendered_cpu(), tmp_path / "ro")


@pytest.mark.parametrize(("errno_", "outcome"), [(28, "old"), (38, "new")])
def test_a_failed_replace_keeps_the_old_output_and_no_staging(tmp_path, monkeypatch, errno_,
                                                              outcome):
    """ENOSPC at the swap keeps the old output; ENOSYS (no renameat2) takes the fallback."""
    rendered = rendered_cpu()
    out = tmp_path / "out"
    target = render.write(rendered, out)
    (target / "Dockerfile").write_text("old\n")

    def failing(a, b):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(swap, "exchange", failing)
    if outcome == "old":
        with pytest.raises(BuilderError, match="No space left"):
            render.write(rendered, out)
    else:
        render.write(rendered, out)
    assert ((target / "Dockerfile").read_text() == "old\n") == (outcome == "old")
    assert sorted(p.name for p in out.iterdir()) == [CPU]


def test_builder_state_a_file_and_sbom_output_unwritable_are_messages(tmp_path, monkeypatch):
    blocker = tmp_path / "state-file"
    blocker.write_text("")
    monkeypatch.setenv("BUILDER_STATE", str(blocker))
    with pytest.raises(BuilderError, match="state-file is a file, not a folder"):
        state.path("logs")
    with pytest.raises(BuilderError, match="is a file, not a folder"):
        sbom_cmd.check_writable(blocker / "image.cdx.json")
    with pytest.raises(BuilderError, match="it is a folder"):
        sbom_cmd.check_writable(tmp_path)


# ---- 8. the smaller ones ---------------------------------------------------------------------


def test_validate_json_prints_json_for_an_invalid_matrix(tmp_path, capsys):
    path = shipped_with(tmp_path, "registry: 127.0.0.1:5000", "registry: 127.0.0.1:99999")
    assert matrix_cmd.cmd_validate(validate_args(path, json=True)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert any("registry" in p and "port 1-65535" in p for p in doc["problems"])


def test_tag_pattern_error_names_the_allowed_characters(tmp_path):
    path = shipped_with(tmp_path, "{tag: latest-runtime,", "{tag: \"a:b/c\",")
    text = load_problems(path)
    assert "letters, digits and _ . -" in text and ": /" not in text


def test_a_tilde_key_reads_as_null_not_a_number(tmp_path):
    path = shipped_with(tmp_path, '"3.11": {image: "mmdebstrap:bookworm"', '~: {image: "x"')
    text = load_problems(path)
    assert '`~` is read as null; write "~" (quoted)' in text and "None" not in text


def test_one_problem_is_printed_once(tmp_path):
    path = shipped_with(tmp_path, "include:\n", "include:\n  - {flavor: slim, cuda: \"12.6\"}\n")
    text = load_problems(path)
    assert text.count("an explicit `cuda` needs the `index_url`") == 1


def test_timeout_scale_must_be_positive_and_ca_bundle_readable(capsys):
    for argv in (["smoke", "img", "--timeout-scale", "-1"], ["smoke", "img", "--timeout-scale",
                                                              "0"],
                 ["build", "--ca-bundle", "/no/such/bundle.pem"]):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(argv)
        assert exc.value.code == 2
    assert "is not a readable file" in capsys.readouterr().err


def test_ca_bundle_reaches_the_host_side_downloads(tmp_path, monkeypatch):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv(proc.CA_BUNDLE_ENV, str(bundle))
    assert proc.host_ca_bundle() == str(bundle)


def test_registry_start_names_a_foreign_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path))
    monkeypatch.setattr(registry, "is_up", lambda addr, timeout=2.0: True)
    monkeypatch.setattr(registry_cmd.portowner, "listener", lambda addr: registry_cmd.portowner
                        .Listener(0, 4242, ["docker-registry", "serve", "/srv/reg/config.yml"]))
    monkeypatch.setattr(registry_cmd.portowner, "free_port", lambda host, start: 5001)
    args = argparse.Namespace(matrix=str(ROOT / "matrix.yaml"), addr=None, action="start",
                              json=False)
    with pytest.raises(BuilderError) as caught:
        registry_cmd.cmd_registry(args)
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith("a registry this checkout did not start answers on "
                                        "127.0.0.1:5000: pid 4242 (`docker-registry serve")
    assert f"its storage in {tmp_path / 'registry' / 'storage'}" in caught.value.hint
    assert "`builder registry start --addr 127.0.0.1:5001`" in caught.value.hint


def test_plan_warns_when_the_engine_does_not_answer(monkeypatch, capsys):
    m = matrix.load(ROOT / "matrix.yaml")
    monkeypatch.setattr(plan, "engine_available", lambda engine: False)
    plan.make_plan(m, [render.render_locked(m, m.variant(CPU), LOCKS)], {}, check_registry=False)
    assert "warning: the Docker engine does not answer" in capsys.readouterr().err


@pytest.mark.parametrize(("remote", "url"), [
    ("/work/main", ""),
    ("git@github.com:org/torch-images.git", "https://github.com/org/torch-images"),
    ("https://user:token@github.com/org/torch-images.git", "https://github.com/org/torch-images"),
])
def test_source_label_is_a_public_url_never_a_local_path(remote, url):
    assert build.public_url(remote) == url


def test_exclude_matching_does_not_scale_with_combinations_times_excludes():
    axes = {"a": [str(i) for i in range(100)], "b": [str(i) for i in range(100)]}
    exclude = [{"a": str(i % 100), "b": f"x{i}"} for i in range(300_000)] + [{"a": "7"}]
    start = time.monotonic()
    combos, _ = matrix_expand.expand(axes, [], exclude)
    assert time.monotonic() - start < 5
    assert len(combos) == 9900
