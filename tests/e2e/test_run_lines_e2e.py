"""Every `docker run` line of a CPU image's catalog page runs, as pasted, from a folder owned by
root with mode 0755 (a home or a checkout often is one the image's uid 1000 cannot write to).

The lines are `catalog_page.run_commands`, the only place the page's commands come from, with
the local image in place of the registry reference. A line with `-it` runs in a pseudo-terminal
and is typed into, as a person would.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest
from fixtures_published import Publication

from builder.model import catalog_page

pytestmark = pytest.mark.docker

TRAIN = "import torch\ntorch.save(torch.ones(2) @ torch.ones(2), 'checkpoint.pt')\nprint('saved')\n"


@pytest.fixture(scope="module")
def image(shared_publication: Publication) -> str:
    """The CPU runtime: the session's local image (fixtures_published), only read."""
    return shared_publication.image


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder owned by root, mode 0755, holding the user's script."""
    here = tmp_path / "checkout"
    here.mkdir()
    (here / "train.py").write_text(TRAIN)
    os.chown(here, 0, 0)
    here.chmod(0o755)
    return here


def in_a_terminal(command: str, cwd: Path, typed: str, timeout: float = 300) -> str:
    """What `command` prints when run in a pseudo-terminal and `typed` is typed into it."""
    main, side = os.openpty()
    child = subprocess.Popen(["bash", "-c", command], cwd=cwd, stdin=side, stdout=side,
                             stderr=side, start_new_session=True)
    os.close(side)
    out, deadline, sent = b"", time.monotonic() + timeout, False
    try:
        while child.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    out += os.read(main, 65536)
                except OSError:
                    break
            if not sent and b">>>" in out:
                os.write(main, typed.encode())
                sent = True
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if child.poll() is None:
            child.kill()
        os.close(main)
    assert child.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_every_run_line_of_a_cpu_page_works_from_a_root_owned_folder(image, folder):
    lines = catalog_page.run_commands({"accelerator": "cpu"}, image)
    assert len(lines) == 2
    for what, command in lines:
        if " -it " in command:
            out = in_a_terminal(command, folder, "import torch; print(6 * 7)\nexit()\n")
            assert "42" in out, (what, out[-2000:])
            continue
        run = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, (what, run.stderr[-2000:])
        assert run.stdout.split() == ["saved"]
        checkpoint = folder / "checkpoint.pt"
        assert checkpoint.stat().st_uid == os.getuid()  # the caller owns what the run wrote


def test_without_the_callers_uid_the_script_line_is_refused(image, folder):
    """What the issue saw: the image's uid 1000 cannot write into the folder (why the page
    passes `--user "$(id -u):$(id -g)"`)."""
    [script] = [c for _, c in catalog_page.run_commands({"accelerator": "cpu"}, image)
                if "$PWD" in c]
    run = subprocess.run(["bash", "-c", script.replace(catalog_page.AS_CALLER + " ", "")],
                         cwd=folder, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "Permission denied" in run.stderr
