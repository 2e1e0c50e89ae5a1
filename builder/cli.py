"""`builder` / `python -m builder`: one subcommand per pipeline stage.

Each command module exposes `register(subparsers)`; it adds its parsers (with the shared
option groups each uses, commands/options.py) and sets `func(args) -> int` as the handler.
The run's settings are resolved once from the parsed arguments and applied around the handler.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback

from builder import __version__
from builder.commands.options import resolve
from builder.core import clock, output, proc, settings
from builder.core.errors import COULD_NOT_RUN, UNEXPECTED_HINT, BuilderError, causes

EXIT_CODES = """exit status (every command):
  0        ok, or nothing to do
  1        findings: invalid matrix, failed smoke check or gate, vulnerabilities, rebuild needed
  2        could not run: engine, registry, network, unreachable source, bad usage or path
  130/143  stopped by SIGINT/SIGTERM"""

# Command → its module in `builder.commands` (`register(subparsers)`), in pipeline order.
# Only the module of the command being run is imported: `builder sbom` need not load jinja2.
COMMANDS = {
    "validate": "matrix", "lock": "matrix", "render": "matrix", "plan": "matrix",
    "base": "build", "build": "build", "smoke": "smoke", "sbom": "sbom", "audit": "sbom",
    "registry": "registry", "publish": "publish", "verify": "verify", "rebuild": "rebuild",
    "keygen": "keys", "attest": "attest", "catalog": "catalog", "reproduce": "reproduce",
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
    modules = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in modules:
        importlib.import_module(f"builder.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
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
    """The command under its settings (resolved once, here), with every error as one message
    (and an exit code) instead of a traceback."""
    try:
        clock.start()  # the command's one day, whatever the time when it finishes
        with settings.applied(resolve(args)):
            return int(args.func(args) or 0)
    except BuilderError as exc:
        if args.debug:
            traceback.print_exc()
        return report_error(args, str(exc), exc.hint or exc.default_hint, exc.exit_code,
                            caused_by=causes(exc), printed=exc.printed)
    except KeyboardInterrupt as exc:  # proc.Interrupted for SIGTERM too: 130 or 143
        print(f"interrupted ({exc or 'SIGINT'}); child processes were stopped", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        raise
    except Exception as exc:  # a bug, or a case without its own message: still no traceback
        if args.debug:
            traceback.print_exc()
        return report_error(args, f"unexpected {type(exc).__name__}: {exc}", UNEXPECTED_HINT,
                            COULD_NOT_RUN, caused_by=causes(exc))


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def report_error(args: argparse.Namespace, message: str, hint: str, code: int, *,
                 caused_by: list[str] | None = None, printed: bool = False) -> int:
    """The error on stderr in uv's style (`error:`, `Caused by:`, `hint:`); with --json also as
    an object on stdout, so a script that parses stdout never mistakes an error for a result,
    unless the command already printed its document (`printed`: its results carry what was
    refused): stdout holds exactly one JSON document."""
    print(f"error: {message}", file=sys.stderr)
    for cause in caused_by or ():
        print(f"  Caused by: {cause}", file=sys.stderr)
    print(f"\nhint: {hint}", file=sys.stderr)
    if getattr(args, "json", False) and not printed:  # one document in every case
        output.emit_json({"error": message, "hint": hint, "caused_by": caused_by or [],
                          "exit_code": code})
    return code
