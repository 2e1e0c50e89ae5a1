"""`builder validate | lock | render | plan`: the stages before any image exists."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from builder.commands.options import add_command, load_selected, matrix_vouchers
from builder.core import keypair
from builder.core.errors import ConfigError
from builder.core.output import emit_json, step, table
from builder.flows import bases, lock_check
from builder.model import lockfile, matrix
from builder.model.matrix_yaml import MatrixError
from builder.stages import locks, plan, render, wheels


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "validate", cmd_validate, ("matrix", "select", "json", "locks"),
                    "check matrix.yaml and list its variants")
    p.add_argument("--offline", action="store_true",
                   help="skip the check that each torch release has a wheel for its python")

    p = add_command(sub, "lock", cmd_lock, ("matrix", "select", "json", "locks"),
                    "resolve variants into hash-pinned locks")
    p.add_argument("--upgrade", action="store_true", help="re-resolve to the newest allowed pins")
    p.add_argument("--check", action="store_true",
                   help="write nothing: re-resolve every lock from its recorded inputs against "
                   "the index (the locked versions preferred, hashes from the index) and name "
                   "locks/<id>.txt:LINE for each package, version or hash that differs; exit 1 "
                   "on any (needs the network)")

    p = add_command(sub, "render", cmd_render, ("matrix", "select", "json", "locks"),
                    "write each variant's Dockerfile")
    p.add_argument("--out", default="out", type=Path, help="output folder (default: out)")

    p = add_command(sub, "plan", cmd_plan, ("matrix", "select", "json", "registries", "locks"),
                    "tags, content hash and build state")
    p.add_argument("--offline", action="store_true",
                   help="do not ask the registry: a variant not up to date locally is `unknown`")


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate the matrix against its JSON schema and the semantic rules (duplicates, YAML
    number traps, impossible combinations, missing locks' CUDA toolkit). Lists every problem as
    FILE:LINE: FIELD: reason; exit 1 when there is any."""
    try:
        m, variants = load_selected(args)
    except MatrixError as exc:
        if not args.json:
            raise
        emit_json({"valid": False, "variants": [],
                   "problems": [p.format(args.matrix) for p in exc.problems]})
        return exc.exit_code
    problems, notes = ([], []) if args.offline else wheels.missing_wheel_problems(
        variants, locks.torch_pulls_cuda)
    problems += lock_problems(m, variants, args.locks)
    for note in notes:
        step(f"note: {note}")
    if args.json:
        emit_json({"valid": not problems, "problems": problems,
                   "variants": [v.id for v in variants]})
    else:
        for problem in problems:
            print(f"{args.matrix}: {problem}")
        print(f"{args.matrix}: {len(variants)} variants"
              f"{', all valid' if not problems else ''}; default: {default_list(variants)}")
    return 1 if problems else 0


def default_list(variants: list[matrix.Variant]) -> str:
    """The default variants, each once with its platforms: `ID (linux/amd64, linux/arm64)`."""
    platforms: dict[str, list[str]] = {}
    for v in variants:
        if v.default:
            platforms.setdefault(v.id, []).append(v.platform)
    return ", ".join(f"{vid} ({', '.join(ps)})" for vid, ps in platforms.items())


def lock_problems(m: matrix.Matrix, variants: list[matrix.Variant], locks_dir: Path) -> list[str]:
    """What only the locks show: stale locks, facts the matrix cannot hold, colliding tags."""
    problems = []
    for v in variants:
        stale = lockfile.stale_reason(locks_dir, v)
        lock = lockfile.read_lock(locks_dir, v)
        if stale:
            problems.append(stale)
        elif lock:
            problems += locks.check_facts(v, lock.facts, m)
    return problems + plan.tag_problems(m, locks_dir)


def cmd_lock(args: argparse.Namespace) -> int:
    """Resolve each selected variant for its own python and platform into locks/<id>.txt (every
    pin == with --hash) and locks/<id>.json (facts derived from the resolved wheels). Only
    variants whose inputs changed are resolved again."""
    m, variants = load_selected(args)
    start = time.monotonic()
    if args.check:
        return check_locks(variants, args.locks, start)
    results = locks.lock_all(m, variants, args.locks, upgrade=args.upgrade, progress=step)
    changed = sum(1 for _, c in results if c)
    if args.json:
        emit_json([{"id": lock.variant_id, "changed": c, "facts": lock.facts}
                   for lock, c in results])
    step(f"locked {len(results)} variants ({changed} changed) in {time.monotonic() - start:.1f} s")
    return 0


def check_locks(variants: list[matrix.Variant], locks_dir: Path, start: float) -> int:
    """`lock --check`: the differences, one line each, then one error (exit 1) when any."""
    problems = lock_check.check_all(variants, locks_dir, progress=step)
    for problem in problems:
        print(problem)
    if problems:
        raise ConfigError(f"{len(problems)} lock line(s) differ from what the index resolves: "
                          f"{problems[0]}",
                          hint="a lock is changed only by `builder lock`; if the index moved, "
                          "relock (`builder lock --upgrade`) and review the diff")
    step(f"{len(variants)} locks match the index ({time.monotonic() - start:.1f} s)")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    """Render templates/ into DIR/<id>/Dockerfile with the lock it installs (pure and offline;
    byte-for-byte deterministic)."""
    m, variants = load_selected(args)
    for v in variants:
        target = render.write(render.render_locked(m, v, args.locks), args.out)
        if not args.json:
            step(f"  {target}/Dockerfile")
    if args.json:
        emit_json([str(args.out / v.key / "Dockerfile") for v in variants])
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """For each selected variant: tags, content hash and state (`build`, or `up-to-date` when
    an image with that hash exists locally or in the registry). --json output is the CI job
    matrix."""
    m, variants = load_selected(args)
    rendered = [render.render_locked(m, v, args.locks) for v in variants]
    trusted = keypair.NOBODY if args.offline else matrix_vouchers(m)
    planned = plan.make_plan(m, rendered, bases.known_digests(m, variants, trusted),
                             check_registry=not args.offline, unasked="unknown",
                             vouchers=trusted)
    if args.json:
        emit_json({"include": [p.as_json(m) for p in planned]})
        return 0
    table(["variant", "tags", "hash", "state"],
          [(p.variant.id, ", ".join(p.tags), p.content_hash[:12],
            p.state + (f" ({p.where})" if p.where else "")) for p in planned])
    todo = sum(p.state == "build" for p in planned)
    unknown = sum(p.state == "unknown" for p in planned)
    step(f"{todo} of {len(planned)} variants to build" + (
        f"; {unknown} `unknown` (--offline: the registry was not asked)" if unknown else ""))
    return 0
