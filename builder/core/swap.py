"""Replace a folder so that every instant has either the old tree or the new one, complete.

A new tree is written into a private staging folder beside the target (`mkdtemp`: created
with O_EXCL semantics, never through a symlink someone planted), then exchanged with the old
one in one `renameat2(RENAME_EXCHANGE)` system call. Two renames (old aside, new in) leave a
window where a SIGKILL loses the output; Python's `os` has no renameat2, hence ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


def exchange(a: Path, b: Path) -> None:
    """Swap two existing paths atomically (Linux >= 3.15 on ext4, xfs, btrfs, tmpfs…).
    OSError(ENOSYS/EINVAL) where the C library or the filesystem cannot."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(a))
    if _renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def staging_folder(target: Path) -> Path:
    """A new private folder beside `target` named `.<name>.<pid>.<random>.tmp`, with the
    permissions a plain mkdir would give; leftovers of dead processes are removed first."""
    remove_stale(target)
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=target.parent))
    folder.chmod(0o777 & ~_umask())
    return folder


def replace_dir(staging: Path, target: Path) -> None:
    """Put the complete tree `staging` at `target` (a folder or nothing) and remove the old
    tree, which the exchange leaves at `staging`."""
    if not target.exists():
        staging.rename(target)
        return
    try:
        exchange(staging, target)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        _two_renames(staging, target)  # a filesystem without RENAME_EXCHANGE
    remove_tree(staging)


def _two_renames(staging: Path, target: Path) -> None:
    """The fallback: the old tree aside, the new into place, with SIGINT/SIGTERM held back
    in between (a SIGKILL there still loses the output: only the exchange is atomic)."""
    old = staging.with_name(staging.name + ".old")
    with _signals_held():
        target.rename(old)
        try:
            staging.rename(target)
        except BaseException:
            old.rename(target)
            raise
    old.rename(staging)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def remove_tree(path: Path) -> None:
    """Remove a staging tree; a symlink in its place is unlinked, never followed."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale(target: Path) -> None:
    """Staging folders of `target` left by processes that died (SIGKILL): their pid is gone."""
    for leftover in target.parent.glob(f".{glob_escape(target.name)}.*.tmp"):
        pid = leftover.name[len(target.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _running(int(pid)) and not leftover.is_symlink():
            remove_tree(leftover)


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
