"""The run's clock: read once, fixed by TORCH_IMAGES_NOW, one day for tags, keys and records."""

from __future__ import annotations

import datetime as dt

import pytest

from builder.core import clock
from builder.core.errors import ConfigError
from builder.stages import base


def test_fixed_clock_names_the_day_in_every_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.ENV, "2026-12-05T23:59:59Z")
    assert clock.stamp() == "20261205"
    assert clock.iso() == "2026-12-05T23:59:59Z"
    assert clock.day() == dt.date(2026, 12, 5)


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


def test_a_ticking_clock_reads_its_start_plus_the_real_time_elapsed() -> None:
    """`--clock-start 23:45`: the session's commands cross midnight 15 minutes in."""
    origin = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=10)
    start = dt.datetime(2026, 12, 5, 23, 45, tzinfo=dt.UTC)
    environ = {clock.START_ENV: "2026-12-05T23:45:00Z", clock.ORIGIN_ENV: origin.isoformat()}
    assert abs((clock.start(environ) - start).total_seconds() - 600) < 3
    after = clock.ticking(start, origin, origin + dt.timedelta(minutes=16))
    assert after.strftime("%Y%m%d %H:%M") == "20261206 00:01"
    assert clock.ticking(start, origin, origin - dt.timedelta(hours=1)) == start


def test_a_fixed_clock_wins_over_a_ticking_one_and_a_start_needs_its_origin() -> None:
    fixed = {clock.ENV: "2026-12-05T23:59:59Z", clock.START_ENV: "2026-12-01T00:00:00Z"}
    assert clock.start(fixed).day == 5
    with pytest.raises(ConfigError, match=clock.ORIGIN_ENV):
        clock.start({clock.START_ENV: "2026-12-05T23:45:00Z"})
