"""`builder registry`: its options and output; the work is `builder.core.registry`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.options import add_command
from builder.core import portowner, registry
from builder.core.errors import BuilderError
from builder.core.output import emit_json, step
from builder.model import matrix


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "registry", cmd_registry, ("matrix", "json"),
                    "run a local registry (start|stop|status)")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--addr", default=None, help="listen address (default: the matrix's registry)")


def cmd_registry(args: argparse.Namespace) -> int:
    """Run Debian's `docker-registry` on the matrix's `registry` address (plain http on
    loopback) with its storage, config, pid file and log in .state/registry/."""
    addr = args.addr or matrix.load(args.matrix).registry
    folder = registry.home()
    if args.action == "start":
        if not registry.is_up(addr) and addr.split(":")[0] not in ("127.0.0.1", "localhost"):
            raise BuilderError(f"`{addr}` is not a loopback address; a local registry serves only "
                               "127.0.0.1/localhost", hint="pass --addr 127.0.0.1:5000")
        refuse_foreign(addr, folder)
        pid = registry.start(addr)
        step(f"registry up on {addr} (pid {pid}, storage: {folder / 'storage'})")
    elif args.action == "stop":
        stopped = registry.stop()
        step("registry stopped" if stopped else f"no registry was running from {folder}")
    up = registry.is_up(addr)
    owner = whose(addr, folder) if up else None
    if args.json:
        emit_json({"address": addr, "up": up, "pid": registry.recorded_pid(folder),
                   "folder": str(folder), "ours": owner is None and up, "owner": owner})
    elif args.action == "status":
        print(f"{addr}: " + ("down" if not up else f"up, the registry started from {folder}"
                             if owner is None else f"up, NOT this checkout's registry: {owner}"))
    return 0 if up or args.action != "status" else 1


def whose(addr: str, folder: Path) -> str | None:
    """None when what answers on `addr` is the registry started from `folder`; else who it is,
    as far as this user can tell (pid, command, user, storage)."""
    ours = registry.recorded_pid(folder)
    found = portowner.listener(addr)
    if ours is not None and (found is None or found.pid in (None, ours)):
        return None
    if found is None:
        return "no local process listens there (another host, or a container's network)"
    storage = found.storage()
    return "; ".join(filter(None, [found.describe(), found.container_hint(),
                                   f"its storage: {storage}" if storage else None]))


def refuse_foreign(addr: str, folder: Path) -> None:
    """Exit 2 when something this checkout did not start holds `addr`: publishing into another
    user's registry (or a container's) must be a choice, never a surprise."""
    up = registry.is_up(addr)
    found = portowner.listener(addr)
    if not up and found is None:
        return
    owner = whose(addr, folder) if up else found.describe() if found else None
    if owner is None:
        return
    host, _, port = addr.rpartition(":")
    free = portowner.free_port(host, int(port) + 1)
    what = "a registry this checkout did not start answers" if up else "the port is taken"
    raise BuilderError(
        f"{what} on {addr}: {owner}",
        hint=f"this checkout's registry would keep its storage in {folder / 'storage'}; "
        + (f"start it on a free port: `builder registry start --addr {host}:{free}` and set "
           f"`registry: {host}:{free}` in matrix.yaml" if free else "pick a free port with --addr")
        + " (or stop the other one)")
