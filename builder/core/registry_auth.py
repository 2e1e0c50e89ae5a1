"""Registry credentials the way the Docker client finds them, and who may receive them.

Resolution order (one for every registry call; `docker push` reads the same config file):
  1. `REGISTRY_USERNAME` / `REGISTRY_PASSWORD` (explicit, for every registry);
  2. `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`): `credHelpers[<host>]`, then
     `credsStore`, then `auths[<host>]` (`auth` = base64 `user:password`, or `identitytoken`);
     a helper is `docker-credential-<name> get` with the server on stdin (Docker's protocol).
Docker Hub's key is `https://index.docker.io/v1/`, as `docker login` writes it.

Hand-written because no maintained Python library reads Docker's config and helpers (the
`docker` SDK does, but pulls in its whole API client for one function).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.core import proc
from builder.core.errors import BuilderError, CommandFailed

DOCKER_HUB_KEY = "https://index.docker.io/v1/"
DOCKER_HUB_HOSTS = {"docker.io", "index.docker.io", "registry-1.docker.io"}
HELPER_TIMEOUT_S = 30.0
IDENTITY_TOKEN_USER = "<token>"  # a helper's way of saying "Secret is an identity token"


class CredentialsError(BuilderError):
    """The Docker config or a credential helper could not be read (exit 2)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    secret: str
    source: str  # where they came from, for messages (never the secret itself)

    @property
    def identity_token(self) -> bool:
        """An OAuth2 refresh token (`docker login` on Azure, some helpers), not a password."""
        return self.username == IDENTITY_TOKEN_USER

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()


def config_dir() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def _key(server: str) -> str:
    """`https://host:port/v1/` and `host:port` name the same registry in `auths`."""
    host = urllib.parse.urlsplit(server if "//" in server else f"//{server}").netloc or server
    return "docker.io" if host in DOCKER_HUB_HOSTS else host


def _load_config() -> dict[str, object]:
    path = config_dir() / "config.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"{path}: not readable JSON: {exc}",
                               hint="fix or remove it (docker login rewrites it)") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"{path}: not a JSON object")
    return doc


def _section(doc: dict[str, object], name: str) -> dict[str, object]:
    value = doc.get(name) or {}
    return value if isinstance(value, dict) else {}


def _from_auths(auths: dict[str, object], registry: str, path: Path) -> Credentials | None:
    for server, entry in auths.items():
        if _key(server) != _key(registry) or not isinstance(entry, dict):
            continue
        where = f"{path} auths[{server}]"
        if token := entry.get("identitytoken"):
            return Credentials(IDENTITY_TOKEN_USER, str(token), where)
        if not entry.get("auth"):
            continue
        try:
            user, sep, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise CredentialsError(f"{where}.auth is not base64 `user:password`",
                                   hint=f"run `docker login {registry}` again")
        return Credentials(user, password, where)
    return None


def helper_get(helper: str, registry: str) -> Credentials | None:
    """`docker-credential-<helper> get` for `registry`; None when it has nothing for it."""
    binary = shutil.which(f"docker-credential-{helper}")
    if binary is None:
        raise CredentialsError(f"credential helper `docker-credential-{helper}` is not on PATH",
                               hint=f"install it, or remove `{helper}` from "
                                    f"{config_dir() / 'config.json'}")
    server = DOCKER_HUB_KEY if _key(registry) == "docker.io" else registry
    try:
        done = proc.run([binary, "get"], input=server, timeout=HELPER_TIMEOUT_S, check=False)
    except CommandFailed as exc:  # timed out
        raise CredentialsError(f"`docker-credential-{helper} get` for `{registry}` gave no "
                               f"answer within {HELPER_TIMEOUT_S:.0f} s",
                               hint="check that the helper works: `echo REGISTRY | "
                               f"docker-credential-{helper} get`") from exc
    if done.returncode != 0:
        if "credentials not found" in (done.stdout + done.stderr).lower():
            return None
        raise CredentialsError(f"`docker-credential-{helper} get` for `{registry}` exited with "
                               f"{done.returncode}", hint=done.stderr.strip()[-300:] or None)
    try:
        answer = json.loads(done.stdout)
        user, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError):
        raise CredentialsError(f"`docker-credential-{helper} get` for `{registry}` did not "
                               "answer JSON with Username and Secret") from None
    return Credentials(user, secret, f"docker-credential-{helper}")


def lookup(registry: str) -> Credentials | None:
    """The credentials for `registry` (host[:port]), in Docker's order; None for anonymous."""
    user, password = os.environ.get("REGISTRY_USERNAME"), os.environ.get("REGISTRY_PASSWORD")
    if user and password:
        return Credentials(user, password, "REGISTRY_USERNAME/REGISTRY_PASSWORD")
    doc = _load_config()
    helpers = {_key(k): v for k, v in _section(doc, "credHelpers").items()}
    if helper := helpers.get(_key(registry)):
        return helper_get(str(helper), registry)
    if (store := doc.get("credsStore")) and (found := helper_get(str(store), registry)):
        return found
    return _from_auths(_section(doc, "auths"), registry, config_dir() / "config.json")


@contextlib.contextmanager
def docker_env(registry: str) -> Iterator[dict[str, str]]:
    """The environment for a `docker push`/`pull` of `registry` that finds the same credentials
    as this client. Docker reads its config itself, so nothing changes unless
    REGISTRY_USERNAME/PASSWORD are set: then a private temporary DOCKER_CONFIG holds the user's
    config with those credentials in `auths` for this registry (its helper and any credsStore,
    which would shadow `auths`, taken out), removed afterwards."""
    user, password = os.environ.get("REGISTRY_USERNAME"), os.environ.get("REGISTRY_PASSWORD")
    if not (user and password):
        yield {}
        return
    doc = _load_config()
    doc.pop("credsStore", None)
    helpers = {k: v for k, v in _section(doc, "credHelpers").items()
               if _key(k) != _key(registry)}
    auths = {k: v for k, v in _section(doc, "auths").items() if _key(k) != _key(registry)}
    server = DOCKER_HUB_KEY if _key(registry) == "docker.io" else registry
    auths[server] = {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
    doc.update(credHelpers=helpers, auths=auths)
    with tempfile.TemporaryDirectory(prefix="builder-docker-config-") as folder:
        path = Path(folder) / "config.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(doc))
        yield {"DOCKER_CONFIG": folder}
