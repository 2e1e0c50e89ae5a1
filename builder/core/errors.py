"""One error family and one exit-code contract for every command (README, `builder --help`):

  0  ok, or nothing to do
  1  findings: an invalid matrix, a failed smoke check or gate, vulnerabilities, a rebuild needed
  2  could not run: the engine, the registry, the network, a source unreachable, bad usage
  130/143  stopped by SIGINT/SIGTERM

`main()` prints these errors without a traceback (`--debug` shows it).
"""

OK, FINDINGS, COULD_NOT_RUN = 0, 1, 2


class BuilderError(Exception):
    """An error the user can act on. The message says what is wrong and what to do."""

    exit_code = COULD_NOT_RUN

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(BuilderError):
    """Invalid matrix or settings: a finding, like a failed validation."""

    exit_code = FINDINGS


class UsageError(BuilderError):
    """A command line that asks for something that does not exist: bad usage (exit 2)."""


class EngineError(BuilderError):
    """The Docker engine is missing, unreachable or lacks a feature."""


class CommandFailed(BuilderError):
    """An external command exited non-zero."""


class GateRefused(BuilderError):
    """An image did not pass a gate (smoke report, SBOM) and was not published."""

    exit_code = FINDINGS
