"""`builder registry`: its options and output; the work is `builder.core.registry`."""

from __future__ import annotations

import argparse

from builder.commands.options import add_command
from builder.core import registry
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
    if args.action == "start":
        if not registry.is_up(addr) and addr.split(":")[0] not in ("127.0.0.1", "localhost"):
            raise BuilderError(f"`{addr}` is not a loopback address; a local registry serves only "
                               "127.0.0.1/localhost", hint="pass --addr 127.0.0.1:5000")
        already_up = registry.is_up(addr)
        pid = registry.start(addr)
        if already_up and pid is None:
            step(f"a registry already answers on {addr}, not one started from {registry.home()}: "
                 "its storage is its own (stop it, or point `registry:` elsewhere)")
        else:
            step(f"registry up on {addr} (storage: {registry.home() / 'storage'})")
    elif args.action == "stop":
        stopped = registry.stop()
        step("registry stopped" if stopped else f"no registry was running from {registry.home()}")
    up = registry.is_up(addr)
    if args.json:
        folder = registry.home()
        emit_json({"address": addr, "up": up, "pid": registry.recorded_pid(folder),
                   "folder": str(folder)})
    elif args.action == "status":
        print(f"{addr}: {'up' if up else 'down'}")
    return 0 if up or args.action != "status" else 1
