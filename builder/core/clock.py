"""The run's clock: the instant a command started, read once.

A command that crosses midnight UTC must use one day throughout — its dated tags, its base's
bootstrap key, its provenance's `day` and its catalog dates — so every part of the builder asks
this module instead of `datetime.now()`. `TORCH_IMAGES_NOW` (an ISO 8601 instant, UTC when it
names no zone) fixes the clock; tests use it to put a build at 23:59:59 and its publish on the
next day. Durations (how long a step took) are not dates and keep their own timers.
"""

from __future__ import annotations

import datetime as dt
import os

from builder.core.errors import ConfigError

ENV = "TORCH_IMAGES_NOW"

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
    fixed = environ.get(ENV, "").strip()
    if not fixed:
        return dt.datetime.now(dt.UTC).replace(microsecond=0)
    try:
        when = dt.datetime.fromisoformat(fixed.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"`{ENV}` is not an ISO 8601 instant: {fixed!r}",
                          hint="e.g. 2026-12-05T23:59:59Z") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
