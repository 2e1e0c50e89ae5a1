"""The run's settings, resolved once (cibuildwheel's options pattern): `builder.cli` makes one
frozen `Settings` from the parsed arguments, the matrix and the environment, and applies it for
the whole command. Modules read `current()`; none writes `os.environ` or a module-level setting
(tests/unit/test_no_global_writes.py). Outside a command (a library call, a test) `current()` is
what the environment says, read afresh each time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from builder.core.errors import UsageError

CA_BUNDLE_ENV = "BUILDER_CA_BUNDLE"
INSECURE_ENV = "BUILDER_INSECURE_REGISTRIES"
DEADLINE_ENV = "BUILDER_REGISTRY_DEADLINE_S"
VERBOSE_ENV = "BUILDER_VERBOSE"
WHEEL_MIRROR_ENV = "BUILDER_WHEEL_MIRROR"
PIP_FIND_LINKS_ENV = "PIP_FIND_LINKS"
DEBIAN_SECURITY_MIRROR_ENV = "BUILDER_DEBIAN_SECURITY_MIRROR"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What every layer may need to know about this run, fixed before it starts."""

    ca_bundle: str | None = None  # --ca-bundle / $BUILDER_CA_BUNDLE: beside the system store
    insecure_registries: tuple[str, ...] = ()  # plain HTTP allowed (Docker's setting)
    registry_deadline_s: float = 30.0  # one registry operation; slow links set more
    verbose: bool = False  # $BUILDER_VERBOSE: every command line on stderr
    # Local wheel folders that stand in for a variant's `find_links` URLs on a machine that
    # cannot reach them ($BUILDER_WHEEL_MIRROR, else the local folders of pip's own
    # $PIP_FIND_LINKS): the lock and the image stay the same, the lock's hashes pin the bytes.
    wheel_mirror: tuple[str, ...] = ()
    # The vulnerability audit's Debian security mirror ($BUILDER_DEBIAN_SECURITY_MIRROR; '':
    # sbom.audit's default, deb.debian.org): a local mirror of the suite, for machines that
    # cannot reach Debian's (publish's audit and the daily check's use it too).
    debian_security_mirror: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **given: object) -> Settings:
        """The environment's settings; `given` (from the command line) wins over it."""
        listed = tuple(s.strip() for s in environ.get(INSECURE_ENV, "").split(",") if s.strip())
        found: dict[str, object] = {
            "ca_bundle": environ.get(CA_BUNDLE_ENV) or None,
            "insecure_registries": listed,
            "registry_deadline_s": _seconds(environ.get(DEADLINE_ENV) or "30"),
            "verbose": environ.get(VERBOSE_ENV, "") not in ("", "0"),
            "wheel_mirror": _mirror(environ),
            "debian_security_mirror": environ.get(DEBIAN_SECURITY_MIRROR_ENV, "").strip(),
        }
        return cls(**{**found, **given})  # type: ignore[arg-type]

    def wheel_sources(self, find_links: Iterable[str]) -> tuple[str, ...]:
        """Where this machine looks for a variant's `find_links` wheels: each URL replaced by
        the mirror folders when a mirror is set; local folders as they are."""
        sources: list[str] = []
        for link in find_links:
            for source in (self.wheel_mirror if is_url(link) and self.wheel_mirror else (link,)):
                if source not in sources:
                    sources.append(source)
        return tuple(sources)

    def host_ca_bundle(self) -> str | None:
        """The CA bundle of host-side HTTPS clients (pip, uv, urllib) and builds: the chosen
        one, else the system's, when that file exists."""
        chosen = self.ca_bundle or HOST_CA_BUNDLE
        return chosen if os.path.exists(chosen) else None


def is_url(link: str) -> bool:
    return link.startswith(("http://", "https://", "file://"))


def _mirror(environ: Mapping[str, str]) -> tuple[str, ...]:
    """$BUILDER_WHEEL_MIRROR (folders joined by `:`), else the local folders in pip's
    $PIP_FIND_LINKS (space-separated): a machine prepared with a wheel folder for pip."""
    if chosen := environ.get(WHEEL_MIRROR_ENV, "").strip():
        return tuple(f for f in chosen.split(os.pathsep) if f)
    return tuple(f for f in environ.get(PIP_FIND_LINKS_ENV, "").split()
                 if f.startswith("/") and os.path.isdir(f))


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
