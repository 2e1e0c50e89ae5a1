"""tests/run_wide.py: a run's shared fixture is made once for all xdist workers, undone once by
the controller; without workers it is a plain session fixture. The e2e suite's slowest modules
are handed out first."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

import pytest
import run_wide


class Factory:
    """A worker's tmp_path_factory: its basetemp is a folder of the run's (the controller's)."""

    def __init__(self, root: Path, worker: str) -> None:
        self.base = root / f"popen-{worker}"

    def getbasetemp(self) -> Path:
        self.base.mkdir(exist_ok=True)
        return self.base

    def mktemp(self, name: str) -> Path:
        folder = self.getbasetemp() / name
        folder.mkdir()
        return folder


def counting(calls: list[Path]) -> run_wide.Make:
    def make(folder: Path, undo: list[run_wide.Undo]) -> dict[str, Any]:
        calls.append(folder)
        undo.append({"registry": str(folder)})
        return {"addr": f"127.0.0.1:{5001 + len(calls)}"}

    return make


def undone(monkeypatch: pytest.MonkeyPatch) -> list[list[run_wide.Undo]]:
    seen: list[list[run_wide.Undo]] = []
    monkeypatch.setattr(run_wide, "undo_all", seen.append)
    return seen


def test_the_second_worker_reads_the_first_ones_record(tmp_path, monkeypatch) -> None:
    calls: list[Path] = []
    seen = undone(monkeypatch)
    records = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        with run_wide.shared(Factory(tmp_path, worker), "registry", counting(calls)) as record:
            records.append(record)
    assert calls == [tmp_path / "registry"] and records == [{"addr": "127.0.0.1:5002"}] * 2
    assert seen == []  # a worker leaves it to the controller
    run_wide.finish_run(tmp_path)
    assert seen == [[{"registry": str(tmp_path / "registry")}]]


def test_a_failure_is_not_paid_again_by_the_other_worker(tmp_path, monkeypatch) -> None:
    def failing(folder: Path, undo: list[run_wide.Undo]) -> dict[str, Any]:
        undo.append({"images": "127.0.0.1:5002/e2e-shared-*"})
        raise RuntimeError("the build failed")

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with pytest.raises(RuntimeError), run_wide.shared(Factory(tmp_path, "gw0"), "published",
                                                      failing):
        pass
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    with pytest.raises(pytest.fail.Exception, match=r"failed in worker gw0: RuntimeError: the "
                       "build failed"), run_wide.shared(Factory(tmp_path, "gw1"), "published",
                                                        counting([])):
        pass
    seen = undone(monkeypatch)
    run_wide.finish_run(tmp_path)
    assert seen == [[{"images": "127.0.0.1:5002/e2e-shared-*"}]]  # what it left, undone


def test_without_workers_it_is_made_and_undone_by_the_fixture(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls: list[Path] = []
    seen = undone(monkeypatch)
    with run_wide.shared(Factory(tmp_path, "master"), "registry", counting(calls)) as record:
        assert record == {"addr": "127.0.0.1:5002"} and seen == []
    assert seen == [[{"registry": str(calls[0])}]]
    assert list(tmp_path.glob("*.json")) == []  # nothing for a controller to undo


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_slowest_modules_are_handed_out_first_and_the_base_removers_last() -> None:
    names = ["tests/e2e/test_catalog_e2e.py::test_a", "tests/e2e/test_rebuild_e2e.py::test_b",
             "tests/e2e/test_signed_base_e2e.py::test_f",
             "tests/e2e/test_catalog_e2e.py::test_c", "tests/e2e/test_reproduce_e2e.py::test_d",
             "tests/unit/test_clock.py::test_e"]
    items = [Item(name) for name in names]
    run_wide.slowest_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [names[4], names[1], names[0], names[3], names[5],
                                               names[2]]
    modules = run_wide.SLOWEST_FIRST + run_wide.BASE_REMOVERS
    assert all((Path(__file__).parents[2] / module).is_file() for module in modules)


def test_the_base_held_aside_keeps_the_other_workers_commands_waiting(tmp_path, monkeypatch
                                                                       ) -> None:
    monkeypatch.setattr(run_wide, "RUN", [tmp_path])
    with run_wide.the_base(exclusive=True):
        with (tmp_path / "base.lock").open("a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another process's command
        with run_wide.the_base(exclusive=False):  # this worker's own command runs
            pass
    with run_wide.the_base(exclusive=False), (tmp_path / "base.lock").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # commands share it
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_without_workers_nothing_is_locked(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run_wide, "RUN", [])
    with run_wide.the_base(exclusive=True), run_wide.the_base(exclusive=False):
        assert run_wide.HELD == []
