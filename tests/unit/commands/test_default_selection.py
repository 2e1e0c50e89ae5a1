"""`default` selects whole variants; `build` with it builds this host's platform and names the
rest; `publish` counts a variant once and its hint names only what the user typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.commands import build as build_cmd
from builder.commands.publish import refusal_hint
from builder.model import matrix, platforms

ROOT = Path(__file__).resolve().parents[3]
SLIM = "2.15.0-py3.11-cuda-slim"


def test_the_shipped_default_names_every_platform_of_its_variants() -> None:
    m = matrix.load(ROOT / "matrix.yaml")
    keys = {v.key for v in m.select(["default=true"])}
    assert {SLIM, f"{SLIM}.linux-arm64", "2.13.0-py3.11-cpu-runtime"} <= keys


def test_build_by_default_leaves_foreign_platforms_to_their_runners(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("linux/amd64"))
    m = matrix.load(ROOT / "matrix.yaml")
    kept = build_cmd.left_to_other_runners(m.select(["default=true"]))
    assert kept and all(v.platform == "linux/amd64" for v in kept)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "left to" in line]
    assert len(lines) == 1 and lines[0].startswith("linux/arm64: left to a linux/arm64 runner")
    assert SLIM in lines[0]


def test_publish_hints_name_only_what_the_user_typed() -> None:
    refused = [{"id": SLIM, "status": "refused", "missing_platforms": ["linux/arm64"],
                "reason": "linux/arm64 not selected"}]
    assert "platform=" not in refusal_hint(["default=true"], refused)
    typed = refusal_hint(["id=" + SLIM, "platform=linux/amd64"], refused)
    assert "`--select platform=linux/amd64`" in typed and "id=" not in typed


def test_a_publish_with_nothing_new_says_nothing_to_do() -> None:
    from builder.commands import publish as publish_cmd

    held = [{"id": "a", "status": "already-published"}, {"id": "b", "status": "already-published"}]
    assert publish_cmd.nothing_to_do(held, dry_run=True) == (
        "nothing to do: the dry run would push nothing; every selected variant (2) is already "
        "published with this content")
    assert publish_cmd.nothing_to_do(held, dry_run=False).startswith("nothing to do: every")
    assert publish_cmd.nothing_to_do([*held, {"id": "c", "status": "would-publish"}],
                                     dry_run=True) is None
