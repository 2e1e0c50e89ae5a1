"""The run's clock: the instant a command started, read once.

A command that crosses midnight UTC must use one day throughout — its dated tags, its base's
bootstrap key, its provenance's `day` and its catalog dates — so every part of the builder asks
this module instead of `datetime.now()`. `TORCH_IMAGES_NOW` (an ISO 8601 instant, UTC when it
names no zone) fixes the clock; tests use it to put a build at 23:59:59 and its publish on the
next day. `TORCH_IMAGES_CLOCK_START` with `TORCH_IMAGES_CLOCK_ORIGIN` makes a clock that ticks:
a command reads START plus the real time elapsed since ORIGIN, so a whole test session can be
started at 23:45 and cross midnight 15 minutes in (tests/conftest.py `--clock-start`).
Durations (how long a step took) are not dates and keep their own timers.
"""

from __future__ import annotations

import datetime as dt
import os

from builder.core.errors import ConfigError

ENV = "TORCH_IMAGES_NOW"
START_ENV = "TORCH_IMAGES_CLOCK_START"  # the instant the ticking clock showed …
ORIGIN_ENV = "TORCH_IMAGES_CLOCK_ORIGIN"  # … at this real instant

_STARTED: list[dt.datetime] = []  # this command's instant, once read (a list: no `global`)


def start(environ: dict[str, str] | None = None) -> dt.datetime:
    """Read the clock for this command (the CLI calls it first); later reads return this."""
    _STARTED[:] = [_read(os.environ if environ is None else environ)]
    return _STARTED[0]


def now() -> dt.datetime:
    """The command's instant (read at first use when `start` was not called)."""
    return _STARTED[0] if _STARTED else start()


def reset() -> None:
    """Forget the instant, so the next command (in one process: tests) reads it again."""
    _STARTED.clear()


def day() -> dt.date:
    return now().date()


def stamp() -> str:
    """`YYYYMMDD`: the day in dated tags and tokens."""
    return now().strftime("%Y%m%d")


def iso() -> str:
    """`YYYY-MM-DDTHH:MM:SSZ`: the instant in records (catalog, provenance, publish)."""
    return now().strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(environ) -> dt.datetime:
    real = dt.datetime.now(dt.UTC).replace(microsecond=0)
    if fixed := environ.get(ENV, "").strip():
        return _instant(ENV, fixed)
    if start := environ.get(START_ENV, "").strip():
        return ticking(_instant(START_ENV, start), _origin(environ), real)
    return real


def ticking(start: dt.datetime, origin: dt.datetime, real: dt.datetime) -> dt.datetime:
    """START plus the real time elapsed since ORIGIN (never before START)."""
    return start + max(real - origin, dt.timedelta(0))


def _origin(environ) -> dt.datetime:
    origin = environ.get(ORIGIN_ENV, "").strip()
    if not origin:
        raise ConfigError(f"`{START_ENV}` is set without `{ORIGIN_ENV}` (the real instant the "
                          "clock showed it)", hint=f"e.g. {ORIGIN_ENV}=$(date -u +%FT%TZ)")
    return _instant(ORIGIN_ENV, origin)


def _instant(name: str, text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"`{name}` is not an ISO 8601 instant: {text!r}",
                          hint="e.g. 2026-12-05T23:59:59Z") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
