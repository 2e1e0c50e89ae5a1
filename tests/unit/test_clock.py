"""The run's clock: read once, fixed by TORCH_IMAGES_NOW, one day for tags, keys and records."""

from __future__ import annotations

import datetime as dt

import pytest

from builder.core import clock
from builder.core.errors import ConfigError
from builder.stages import base, publish


def test_fixed_clock_names_the_day_in_every_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.ENV, "2026-12-05T23:59:59Z")
    assert clock.stamp() == "20261205"
    assert clock.iso() == "2026-12-05T23:59:59Z"
    assert clock.day() == dt.date(2026, 12, 5)
    assert publish.today() == "20261205"


def test_the_clock_is_read_once_per_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that crosses midnight keeps its first day: a later read does not see the new one."""
    monkeypatch.setenv(clock.ENV, "2026-12-05T23:59:59Z")
    key = base.bootstrap_key("bookworm")
    monkeypatch.setenv(clock.ENV, "2026-12-06T00:00:01Z")
    assert clock.stamp() == "20261205"
    assert base.bootstrap_key("bookworm") == key
    clock.reset()  # the next command
    assert clock.stamp() == "20261206"
    assert base.bootstrap_key("bookworm") != key


def test_a_zone_is_converted_and_a_naive_instant_is_utc() -> None:
    assert clock.start({clock.ENV: "2026-12-06T01:00:00+02:00"}).date() == dt.date(2026, 12, 5)
    assert clock.start({clock.ENV: "2026-12-06T00:30:00"}).date() == dt.date(2026, 12, 6)


def test_an_unset_clock_is_utc_now() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    assert before <= clock.start({}) <= dt.datetime.now(dt.UTC)


def test_a_malformed_clock_is_one_error() -> None:
    with pytest.raises(ConfigError, match=clock.ENV):
        clock.start({clock.ENV: "yesterday"})


def test_a_build_after_midnight_takes_the_bases_already_here(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Every variant up to date on the engine's base: no new day's bootstrap (flows/build)."""
    from dataclasses import dataclass

    from builder.flows import build

    @dataclass(frozen=True)
    class P:
        state: str

    seen: list[object] = []
    monkeypatch.setattr(build.base, "known_digests", lambda v, m: {"base": "sha256:b"})
    monkeypatch.setattr(build, "registry_served", lambda v: None)
    states = ["up-to-date"]
    monkeypatch.setattr(build.plan, "make_plan",
                        lambda m, r, d, **kw: seen.append(d) or [P(s) for s in states])
    assert build.already_built(None, ["v"], ["r"]) == [P("up-to-date")]
    assert seen == [{"base": "sha256:b"}]
    states[:] = ["up-to-date", "build"]
    assert build.already_built(None, ["v", "w"], ["r", "s"]) is None


def test_a_foreign_base_is_always_made(monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.flows import build

    monkeypatch.setattr(build, "registry_served", lambda v: "bookworm")
    assert build.already_built(None, ["v"], ["r"]) is None
