"""A path that cannot be written is one message, never a traceback: render's output folder,
BUILDER_STATE, the SBOM output, a read-only state folder; a failed swap keeps the old output."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from matrix_files import CPU, LOCKS, ROOT

from builder.commands import sbom as sbom_cmd
from builder.core import state, swap
from builder.core.errors import BuilderError
from builder.flows import build as build_flow
from builder.model import lockfile, matrix
from builder.model.rendered import Rendered
from builder.stages import render


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


def test_a_read_only_state_folder_is_a_message_at_the_build_lock(tmp_path, monkeypatch):
    def read_only(self: Path, *args: object, **kwargs: object) -> object:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    state.path()  # the folder exists; only writing into it fails, as on a read-only mount
    monkeypatch.setattr(Path, "open", read_only)
    with (pytest.raises(BuilderError, match=r"cannot write .*build\.lock: Read-only file system"),
          build_flow.build_lock()):
        pass
