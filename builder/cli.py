"""`builder` / `python -m builder`: one subcommand per pipeline stage.

Each stage module exposes `register(subparsers, common)`; it adds its parser and sets
`func(args) -> int` as the handler. `common` is the parent parser holding the shared options.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback

from builder import __version__
from builder.commands.options import common_parser
from builder.core import output, proc, registry_http
from builder.core.errors import COULD_NOT_RUN, BuilderError

EXIT_CODES = """exit status (every command):
  0        ok, or nothing to do
  1        findings: invalid matrix, failed smoke check or gate, vulnerabilities, rebuild needed
  2        could not run: engine, registry, network, unreachable source, bad usage or path
  130/143  stopped by SIGINT/SIGTERM"""

# Command → its module in `builder.commands` (`register(subparsers, common)`), in pipeline order.
# Only the module of the command being run is imported: `builder sbom` need not load jinja2.
COMMANDS = {
    "validate": "matrix", "lock": "matrix", "render": "matrix", "plan": "matrix",
    "base": "build", "build": "build", "smoke": "smoke", "sbom": "sbom", "audit": "sbom",
    "registry": "registry", "publish": "publish", "verify": "verify", "rebuild": "rebuild",
    "keygen": "keys", "catalog": "catalog", "reproduce": "reproduce",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone (what `main` needs to run it)."""
    parser = argparse.ArgumentParser(
        prog="builder",
        description="Build vetted PyTorch + CUDA images from matrix.yaml: validate → lock → render "
        "→ plan → build → smoke → sbom → publish.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = common_parser()
    modules = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in modules:
        importlib.import_module(f"builder.commands.{name}").register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    registry_http.add_insecure(getattr(args, "insecure_registry", []))
    proc.install_signal_handlers()
    try:
        code = run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `builder … --json | head`: the reader has what it wanted
        _drop_stdout()
        return SIGPIPE_EXIT


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a Unix tool whose reader went away exits with


def run(args: argparse.Namespace) -> int:
    """The command, with every error as one message (and an exit code) instead of a traceback."""
    try:
        return int(args.func(args) or 0)
    except BuilderError as exc:
        if args.debug:
            traceback.print_exc()
        return report_error(args, str(exc), exc.hint, exc.exit_code)
    except KeyboardInterrupt as exc:  # proc.Interrupted for SIGTERM too: 130 or 143
        print(f"interrupted ({exc or 'SIGINT'}); child processes were stopped", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        raise
    except Exception as exc:  # a bug, or a case without its own message: still no traceback
        if args.debug:
            traceback.print_exc()
        return report_error(args, f"unexpected {type(exc).__name__}: {exc}",
                            "run again with --debug for the traceback, and please report it",
                            COULD_NOT_RUN)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def report_error(args: argparse.Namespace, message: str, hint: str | None, code: int) -> int:
    """The error on stderr; with --json also as an object on stdout, so a script that parses
    stdout never mistakes an error for a result, unless the command already printed its
    document (its results carry what was refused): stdout holds exactly one JSON document."""
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"\n{hint}", file=sys.stderr)
    if getattr(args, "json", False) and not output.printed_json:  # one document in every case
        output.emit_json({"error": message, "hint": hint, "exit_code": code})
    return code
