"""One error family; each kind has its own exit code. `main()` prints them without a traceback."""


class BuilderError(Exception):
    """An error the user can act on. The message says what is wrong and what to do."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(BuilderError):
    """Invalid matrix or settings: exit 1, like a failed validation."""

    exit_code = 1


class EngineError(BuilderError):
    """The Docker engine is missing, unreachable or lacks a feature."""

    exit_code = 3


class CommandFailed(BuilderError):
    """An external command exited non-zero."""

    exit_code = 4


class GateRefused(BuilderError):
    """An image did not pass a gate (smoke report, SBOM) and was not published."""

    exit_code = 5
