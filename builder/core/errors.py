"""One error family and one exit-code contract for every command (README, `builder --help`):

  0  ok, or nothing to do
  1  findings: an invalid matrix, a failed smoke check or gate, vulnerabilities, a rebuild needed
  2  could not run: the engine, the registry, the network, a source unreachable, bad usage
  130/143  stopped by SIGINT/SIGTERM

`main()` prints these errors in uv's style, without a traceback (`--debug` shows it):

    error: <what is wrong, naming the file, field or reference>
      Caused by: <the error underneath, when one was kept with `raise … from exc`>

    hint: <what to do>

Every error has a hint: its own, else its kind's `default_hint`.
"""

OK, FINDINGS, COULD_NOT_RUN = 0, 1, 2


class BuilderError(Exception):
    """An error the user can act on. The message says what is wrong and what to do.
    `printed`: the command already printed its --json document (whose results say what
    failed), so the error adds nothing to stdout."""

    exit_code = COULD_NOT_RUN
    default_hint = "run again with --debug to see where it stopped"

    def __init__(self, message: str, hint: str | None = None, *, printed: bool = False) -> None:
        super().__init__(message)
        self.hint = hint
        self.printed = printed


class ConfigError(BuilderError):
    """Invalid matrix or settings: a finding, like a failed validation."""

    exit_code = FINDINGS
    default_hint = "fix what is named above and run again"


class UsageError(BuilderError):
    """A command line that asks for something that does not exist: bad usage (exit 2)."""

    default_hint = "see `builder COMMAND --help`"


class EngineError(BuilderError):
    """The Docker engine is missing, unreachable or lacks a feature."""

    default_hint = "check that the engine runs and answers: `docker info`"


class CommandFailed(BuilderError):
    """An external command exited non-zero."""

    default_hint = "run again with BUILDER_VERBOSE=1 to see every command it runs"


class GateRefused(BuilderError):
    """An image did not pass a gate (smoke report, SBOM) and was not published."""

    exit_code = FINDINGS
    default_hint = "nothing of it was published; see the reasons above"


class CheckFailed(BuilderError):
    """A check of an image (`builder verify`) did not pass: a finding."""

    exit_code = FINDINGS
    default_hint = "every check is in the table above; run the image only once each passes"


UNEXPECTED_HINT = "run again with --debug for the traceback, and please report it"


def causes(exc: BaseException, limit: int = 5) -> list[str]:
    """The chain under `exc` kept by `raise … from cause`, one line each (`Caused by:`)."""
    found: list[str] = []
    cause = exc.__cause__
    while cause is not None and len(found) < limit:
        lines = str(cause).strip().splitlines()
        line = lines[0] if lines else type(cause).__name__
        if line not in str(exc):  # a message that already quotes its cause says it once
            found.append(line)
        cause = cause.__cause__
    return found
