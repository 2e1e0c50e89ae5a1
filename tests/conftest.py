"""Fixtures for every test; tests/unit and tests/e2e each add their own conftest."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
import run_wide

from builder.core import clock
from builder.model import matrix

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--clock-start", metavar="HH:MM", help="run the session on a clock that "
                     "starts at HH:MM UTC (the last one, today's or yesterday's) and ticks: "
                     "`--clock-start 23:45` crosses midnight 15 minutes in (builder.core.clock)")


def pytest_configure(config: pytest.Config) -> None:
    """`--clock-start` (or `TORCH_IMAGES_CLOCK_START` alone): every builder command of the
    session, and the tests' own reads of the clock, see START plus the time elapsed since the
    session began (the builder's processes inherit both variables). Here, not in tests/e2e's
    conftest: an option must be known before pytest collects `tests`. An xdist worker keeps the
    controller's two variables (it inherits its environment): one clock for the whole run; and
learns the run's folder (run_wide.RUN)."""
    if hasattr(config, "workerinput"):
        run_wide.RUN.append(Path(config.option.basetemp).parent)  # xdist sets it per worker
        clock.reset()
        return
    real = dt.datetime.now(dt.UTC).replace(microsecond=0)
    if wanted := config.getoption("--clock-start", None):
        os.environ[clock.START_ENV] = clock_start(wanted, real).strftime("%Y-%m-%dT%H:%M:%SZ")
    if os.environ.get(clock.START_ENV) and not os.environ.get(clock.ORIGIN_ENV):
        os.environ[clock.ORIGIN_ENV] = real.strftime("%Y-%m-%dT%H:%M:%SZ")
    clock.reset()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    run_wide.slowest_first(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller, once every worker has finished, undoes what they made once for
    the whole run (run_wide: the shared registry, the shared publication's images)."""
    config = session.config
    if config.pluginmanager.hasplugin("dsession") and hasattr(config, "_tmp_path_factory"):
        run_wide.finish_run(config._tmp_path_factory.getbasetemp())  # as xdist finds it


def clock_start(wanted: str, real: dt.datetime) -> dt.datetime:
    """The last HH:MM UTC not after `real` (never ahead of the real clock: a tag dated after
    the real today is no publication for a reader without the option)."""
    hour, _, minute = wanted.partition(":")
    start = real.replace(hour=int(hour), minute=int(minute or 0), second=0)
    return start if start <= real else start - dt.timedelta(days=1)


@pytest.fixture(autouse=True)
def _clock() -> None:
    """Each test's in-process commands read the clock again, as each builder command does
    (TORCH_IMAGES_NOW, or the ticking clock, when set)."""
    clock.reset()


@pytest.fixture(scope="session")
def shipped() -> matrix.Matrix:
    """The shipped matrix.yaml (read only)."""
    return matrix.load(ROOT / "matrix.yaml")


@pytest.fixture
def write_matrix(tmp_path: Path):
    """Write a matrix file from text; returns its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
