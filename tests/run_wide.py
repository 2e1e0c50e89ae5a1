"""What a test run makes once for all its pytest-xdist workers (issue 39: `nox -s tests` runs
the modules on two workers): the session registry, the minimal base, the shared publication.

A session fixture is one per process, so under xdist each worker would start its own registry
and build and publish its own CPU runtime. `shared` makes the thing in the first worker that
asks, under a file lock in the run's folder (the controller's basetemp, each worker's basetemp's
parent), and writes its JSON record there; a worker that asks later waits on the lock and reads
the record. What undoes it (a registry to stop, images to remove) is recorded beside it, as
data, and undone by the controller once every worker has finished (`finish_run`, from
tests/conftest.py's pytest_sessionfinish): a worker that runs out of modules early must not stop
the registry under the other one. Without xdist (`-p no:xdist`, `-n 0`) the fixture makes and
undoes it itself, as a plain session fixture does. Also: the order the workers take the
modules in, the slowest first (`slowest_first`); and `the_base`, the engine's bootstrapped base
held by one worker's test that removes it while the other worker's commands wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

# One undo step: {"registry": its folder} stops it, {"images": a reference filter such as
# `127.0.0.1:5001/e2e-shared-1234abcd-torch*`} removes the local images it matches.
Undo = dict[str, str]
Make = Callable[[Path, list[Undo]], dict[str, Any]]


# The slowest modules (seconds in a 2-core run), started first: xdist's `--dist loadfile` hands
# out whole modules in collection order (noxfile.py turns its reordering by test count off), so
# a long module begun last would run alone at the end.
SLOWEST_FIRST = (
    "tests/e2e/test_e2e.py",  # ~570 s (the CUDA slim and devel; the shared publication first)
    "tests/e2e/test_workflow_rehearsal.py",  # ~300 s, its own clone: the other worker's first
    # The session's publication is made by then: its first test does not wait for it.
    "tests/e2e/test_reproduce_e2e.py",  # ~200 s (a private engine: two builds, one reproduce)
    "tests/e2e/test_rebuild_e2e.py",  # ~170 s
    "tests/e2e/test_signed_cache_rebuild_e2e.py",  # two real rebuilds
    # Builds outside `run_builder` (so outside the base lock): done before the two below.
    "tests/e2e/test_readme_quickstart_e2e.py",
)
# The modules that take the engine's base away for a while (helpers.base_removed), handed out
# last: by then the other worker runs only `run_builder` commands, which wait for the base.
BASE_REMOVERS = (
    "tests/e2e/test_midnight_e2e.py",
    "tests/e2e/test_signed_base_e2e.py",
)


def slowest_first(items: list[pytest.Item]) -> None:
    """SLOWEST_FIRST's modules first, BASE_REMOVERS last, the rest in collection order between
    (a stable sort)."""
    rank = {module: index for index, module in enumerate(SLOWEST_FIRST)}
    rank |= {module: len(rank) + 1 + index for index, module in enumerate(BASE_REMOVERS)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOWEST_FIRST)))


def worker() -> str | None:
    """This process's xdist worker (gw0, gw1 …); None in a run without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


@contextlib.contextmanager
def shared(factory: pytest.TempPathFactory, name: str, make: Make) -> Iterator[dict[str, Any]]:
    """The record `make(folder, undo)` returns, made once per run. `make` appends to `undo`
    as it goes (before each step that leaves something behind), so that a failure halfway is
    undone too; a failure is recorded, and a worker asking later fails with it instead of
    paying for the same failure again (or skips, when it skipped)."""
    if worker() is None:
        undo: list[Undo] = []
        try:
            record = make(factory.mktemp(name), undo)
            yield record
        finally:
            undo_all(undo)
        return
    root = factory.getbasetemp().parent
    with FileLock(root / f"{name}.lock"):
        if not (root / f"{name}.json").exists():
            make_recorded(root, name, make)
        saved = json.loads((root / f"{name}.json").read_text())
    if "skip" in saved:
        pytest.skip(saved["skip"])
    if "error" in saved:
        pytest.fail(f"the run's shared {name} failed in worker {saved['worker']}: "
                    f"{saved['error']}", pytrace=False)
    yield saved["record"]


def make_recorded(root: Path, name: str, make: Make) -> None:
    """`make` into root/name, its outcome (record or error) and undo steps into name.json."""
    undo: list[Undo] = []
    outcome: dict[str, Any] = {"worker": worker(), "undo": undo}
    folder = root / name
    folder.mkdir(exist_ok=True)
    try:
        outcome["record"] = make(folder, undo)
    except pytest.skip.Exception as exc:
        outcome["skip"] = exc.msg
        raise
    except BaseException as exc:
        outcome["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
        raise
    finally:
        (root / f"{name}.json").write_text(json.dumps(outcome))


def finish_run(root: Path) -> None:
    """Undo what the run's workers made once (called by the controller, after them all)."""
    for path in sorted(root.glob("*.json")):
        undo_all(json.loads(path.read_text()).get("undo", []))


def undo_all(undo: list[Undo]) -> None:
    """The undo steps, last first (images before the registry they were pushed to)."""
    from builder.core import registry

    for step in reversed(undo):
        if "images" in step:
            remove_images(step["images"])
        if "registry" in step:
            registry.stop(Path(step["registry"]))


def remove_images(reference: str) -> None:
    """Remove every local image reference matching `reference` (docker's reference filter), and
    the dangling images built for its repository: a module that builds the shared image again
    (a moved tag) leaves the older build unnamed, with only its title label to say whose."""
    from builder.core import engine

    remove_named(reference)
    if repository := reference.rsplit("/", 1)[-1].rstrip("*"):
        dangling = engine.docker("images", "--quiet", "--no-trunc", "--filter", "dangling=true",
                                 check=False).stdout.split()
        for image_id in dangling:
            if built_for(image_id, [repository]):
                engine.remove_image(image_id)


def remove_named(reference: str) -> None:
    """Remove every local image reference matching `reference` (docker's reference filter)."""
    from builder.core import engine

    refs = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}",
                         "--filter", f"reference={reference}").stdout.split()
    for ref in refs:
        engine.remove_image(ref)


def labels_of(image_id: str) -> dict[str, str]:
    """The image's labels ({} for an image gone or without any)."""
    from builder.core import engine

    return ((engine.inspect_image(image_id) or {}).get("Config") or {}).get("Labels") or {}


def built_for(image_id: str, repositories: Iterable[str]) -> bool:
    """Whether the builder made the image for one of `repositories` (its title label,
    `repository:variant`, starts with one)."""
    title = labels_of(image_id).get(TITLE, "")
    return bool(title) and title.startswith(tuple(r for r in repositories if r))


TITLE = "org.opencontainers.image.title"  # `repository:variant` on every image the builder makes

# The run's folder in an xdist worker (tests/conftest.py sets it: its basetemp's parent).
RUN: list[Path] = []
# Whether this process holds the base, exclusively or not, innermost last.
HELD: list[bool] = []


@contextlib.contextmanager
def the_base(*, exclusive: bool) -> Iterator[None]:
    """The engine's bootstrapped base, locked for the run (nothing to lock without workers): a
    test that removes the base's names (a fresh runner's engine) takes it exclusively, each
    `builder` command of the other worker shared, so that no build there bootstraps the base
    again meanwhile, or finds its names gone mid-build."""
    if not RUN or (any(HELD) and not exclusive):  # this process holds it already
        yield
        return
    with (RUN[0] / "base.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        HELD.append(exclusive)
        try:
            yield
        finally:
            HELD.pop()
            fcntl.flock(fh, fcntl.LOCK_UN)
