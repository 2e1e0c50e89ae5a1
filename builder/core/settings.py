"""The run's settings, resolved once (cibuildwheel's options pattern): `builder.cli` makes one
frozen `Settings` from the parsed arguments, the matrix and the environment, and applies it for
the whole command. Modules read `current()`; none writes `os.environ` or a module-level setting
(tests/unit/test_no_global_writes.py). Outside a command (a library call, a test) `current()` is
what the environment says, read afresh each time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from builder.core.errors import UsageError

CA_BUNDLE_ENV = "BUILDER_CA_BUNDLE"
INSECURE_ENV = "BUILDER_INSECURE_REGISTRIES"
DEADLINE_ENV = "BUILDER_REGISTRY_DEADLINE_S"
VERBOSE_ENV = "BUILDER_VERBOSE"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What every layer may need to know about this run, fixed before it starts."""

    ca_bundle: str | None = None  # --ca-bundle / $BUILDER_CA_BUNDLE: beside the system store
    insecure_registries: tuple[str, ...] = ()  # plain HTTP allowed (Docker's setting)
    registry_deadline_s: float = 30.0  # one registry operation; slow links set more
    verbose: bool = False  # $BUILDER_VERBOSE: every command line on stderr

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **given: object) -> Settings:
        """The environment's settings; `given` (from the command line) wins over it."""
        listed = tuple(s.strip() for s in environ.get(INSECURE_ENV, "").split(",") if s.strip())
        found: dict[str, object] = {
            "ca_bundle": environ.get(CA_BUNDLE_ENV) or None,
            "insecure_registries": listed,
            "registry_deadline_s": _seconds(environ.get(DEADLINE_ENV) or "30"),
            "verbose": environ.get(VERBOSE_ENV, "") not in ("", "0"),
        }
        return cls(**{**found, **given})  # type: ignore[arg-type]

    def host_ca_bundle(self) -> str | None:
        """The CA bundle of host-side HTTPS clients (pip, uv, urllib) and builds: the chosen
        one, else the system's, when that file exists."""
        chosen = self.ca_bundle or HOST_CA_BUNDLE
        return chosen if os.path.exists(chosen) else None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise UsageError(f"${DEADLINE_ENV} is `{text}`, not a number of seconds above 0",
                         hint=f"unset it (default 30) or set e.g. {DEADLINE_ENV}=120")
    return value


_APPLIED: list[Settings] = []  # the settings of the command running now (innermost last)


def current() -> Settings:
    """This run's settings: those `applied` by the command, else the environment's."""
    return _APPLIED[-1] if _APPLIED else Settings.from_env()


@contextlib.contextmanager
def applied(settings: Settings) -> Iterator[Settings]:
    """The start-up place: `settings` hold for the command run inside this block (and are
    gone after it, so one process can run several commands, as tests do)."""
    _APPLIED.append(settings)
    try:
        yield settings
    finally:
        _APPLIED.remove(settings)
