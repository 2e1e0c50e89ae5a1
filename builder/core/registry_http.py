"""HTTP for OCI registries: TLS and credentials as Docker has them, bounded against hostile
servers.

urllib3 does the HTTP: connection pools, TLS (hostname checks, client certificates), bodies.
Written here because no library does it the way a registry client must:
  - the distribution auth dance: no credentials before a challenge; Basic, or a Bearer token
    per set of repository scopes from the challenge's realm, refreshed when it expires;
    credentials never to another host (a redirect to blob storage is followed without them), a
    realm on another host gets them only when it shares the registry's domain, and never over
    plain HTTP to a host that is not loopback;
  - Docker's scheme choice: HTTPS first everywhere; plain HTTP only for an insecure registry
    (127.0.0.0/8, ::1, localhost, `--insecure-registry`, the matrix's `insecure_registries`,
    `$BUILDER_INSECURE_REGISTRIES`, `insecure-registries` of /etc/docker/daemon.json), and
    never after a certificate failure;
  - CAs: the system store, `$BUILDER_CA_BUNDLE` (`--ca-bundle`), and
    `/etc/docker/certs.d/<host[:port]>/*.crt` (`$BUILDER_CERTS_D` moves that folder), client
    certificates from `client.cert`/`client.key` there;
  - an overall deadline per operation enforced by a watchdog that shuts the socket (a server
    trickling a byte at a time cannot outlast it), answers read against a size cap, and
    `429 Retry-After` honoured within the deadline.
"""

from __future__ import annotations

import contextlib
import email.utils
import re
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3

from builder.core import limits, registry_auth
from builder.core.registry_transport import (
    WATCH,
    Deadline,
    RegistryError,
    Transient,
    Watchdog,
    certs_dir,
    forget_pools,
    is_insecure,
    is_loopback,
    pool,
    split_host,
)

READ_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
READ_CHUNK = 1 << 20
ERROR_BODY_CAP = 16 << 10
TOKEN_CAP = 1 << 20
MAX_REDIRECTS = 5
MAX_RETRY_AFTER = 5  # 429s in a row before giving up
DEFAULT_TOKEN_S = 60  # the distribution spec's default `expires_in`
DOCKER_HUB_API = "registry-1.docker.io"


class Refused(RegistryError):
    """Nothing listens at the registry's address (connection refused): said at once, never
    retried, with what to check."""


def refused(registry: str, where: str) -> Refused:
    local = is_loopback(registry)
    return Refused(f"registry `{registry}`: {where}: connection refused (nothing listens there)",
                   hint="is it running? `builder registry start` (then `builder registry "
                   "status`)" if local else f"is `{registry}` the right address, and is its "
                   "registry up? `curl -sI https://" + registry + "/v2/` asks it")


# ---- answers ------------------------------------------------------------------------------------


def shown(text: str, limit: int = 200) -> str:
    """Server-sent text fit for a one-line message: printable, whitespace folded, cut short."""
    folded = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return folded if len(folded) <= limit else folded[:limit] + "…"


class Answer:
    """A response whose body is read on demand: capped, or streamed chunk by chunk."""

    def __init__(self, session: Session, method: str, url: str,
                 raw: urllib3.BaseHTTPResponse, dog: Watchdog, deadline: Deadline) -> None:
        self.session, self.method, self.url = session, method, url
        self.raw, self.dog, self.deadline = raw, dog, deadline
        self.status = raw.status
        self.headers = raw.headers
        self._done = False

    @property
    def where(self) -> str:
        return f"{self.method} {self.url}"

    def fail(self, problem: str) -> RegistryError:
        self.close()
        return RegistryError(f"registry `{self.session.registry}`: {self.where}: {problem}")

    def header(self, name: str) -> str:
        value = self.headers.get(name)
        if not value:
            raise self.fail(f"the answer has no `{name}` header")
        return value

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; the deadline is checked between reads."""
        try:
            while data := self.raw.read1(READ_CHUNK):
                self.deadline.check(self.session.registry, self.where)
                yield data
            self._done = True
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.close()
            self.deadline.check(self.session.registry, self.where)
            raise Transient(f"registry `{self.session.registry}`: {self.where}: the answer "
                            f"broke off: {exc}") from None
        finally:
            self.close()

    def read(self, cap: int, what: str = "answer") -> bytes:
        """The whole body, refused as soon as it is known to exceed `cap` bytes."""
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > cap:
            raise self.fail(f"the {what} is {int(length)} bytes, over the {cap}-byte limit")
        body = bytearray()
        for chunk in self.chunks():
            body += chunk
            if len(body) > cap:
                raise self.fail(f"the {what} is over the {cap}-byte limit")
        return bytes(body)

    def json_object(self, cap: int, what: str) -> dict[str, Any]:
        return limits.json_object(self.read(cap, what), f"the {what}", self.fail)

    def close(self) -> None:
        """Done with the answer: a fully read one gives its connection back to the pool, a
        half-read one (an error, a refused body) closes it."""
        self.dog.cancel()
        with contextlib.suppress(Exception):
            if self._done or self.raw.length_remaining == 0:
                self.raw.drain_conn()  # nothing left to read: the connection is reused
            else:
                self.raw.close()


# ---- auth ---------------------------------------------------------------------------------------


def parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…",scope="…"` → ("bearer", {...})."""
    scheme, _, rest = value.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


def same_domain(a: str, b: str) -> bool:
    """Hosts under one registrable domain (registry-1.docker.io and auth.docker.io): the last
    two labels match; IP addresses only match themselves."""
    if a == b:
        return True
    if any(c.replace(".", "").isdigit() or ":" in c for c in (a, b)):
        return False
    return a.split(".")[-2:] == b.split(".")[-2:] and a.count(".") >= 1


@dataclass
class Token:
    value: str
    expires: float


@dataclass
class Session:
    """What one process knows about one registry: its scheme, its challenge, its tokens."""

    registry: str
    scheme: str | None = None
    challenge: tuple[str, dict[str, str]] | None = None
    tokens: dict[tuple[str, ...], Token] = field(default_factory=dict)
    _creds: Any = None
    _creds_read: bool = False

    @property
    def host(self) -> str:
        """Where the API answers: Docker Hub's `docker.io` is served by registry-1.docker.io."""
        return DOCKER_HUB_API if self.registry in registry_auth.DOCKER_HUB_HOSTS else self.registry

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}"

    def credentials(self) -> registry_auth.Credentials | None:
        if not self._creds_read:
            self._creds = registry_auth.lookup(self.registry)
            self._creds_read = True
        return self._creds

    # ---- sending ----------------------------------------------------------------------------

    def _open(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
              deadline: Deadline, read_timeout: float) -> Answer:
        """One request, following redirects; credentials stay with the registry's origin."""
        origin = urllib.parse.urlsplit(url)[:2]
        for _ in range(MAX_REDIRECTS + 1):
            deadline.check(self.registry, f"{method} {url}")
            parts = urllib.parse.urlsplit(url)
            if parts[:2] != origin:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            dog = Watchdog(deadline)
            WATCH.dog = dog
            timeout = urllib3.Timeout(connect=min(CONNECT_TIMEOUT_S, deadline.left()),
                                      read=min(read_timeout, max(deadline.left(), 0.01)))
            try:
                raw = pool(parts.netloc).request(
                    method, url, headers=headers, body=body, redirect=False,
                    preload_content=False, decode_content=False, timeout=timeout)
            except urllib3.exceptions.SSLError as exc:
                dog.cancel()
                raise self._tls_error(method, url, exc) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                dog.cancel()
                deadline.check(self.registry, f"{method} {url}")
                reason = str(exc).split("): ", 1)[-1]  # without urllib3's connection repr
                if isinstance(exc, ConnectionRefusedError) or "Connection refused" in reason:
                    raise refused(self.registry, f"{method} {url}") from None
                raise Transient(f"registry `{self.registry}`: {method} {url}: {reason}") from None
            finally:
                WATCH.dog = None
            answer = Answer(self, method, url, raw, dog, deadline)
            location = raw.headers.get("Location")
            if raw.status not in (301, 302, 303, 307, 308) or not location:
                return answer
            answer.close()
            url = urllib.parse.urljoin(url, location)
            if raw.status == 303:
                method, body = "GET", None
        raise RegistryError(f"registry `{self.registry}`: {method} {url}: more than "
                            f"{MAX_REDIRECTS} redirects")

    def _tls_error(self, method: str, url: str, exc: Exception) -> RegistryError:
        verify = "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate" in str(exc).lower()
        error = Transient if not verify else RegistryError
        hint = (f"trust its CA: --ca-bundle FILE, or {certs_dir(self.registry)}/ca.crt"
                if verify else None)
        return error(f"registry `{self.registry}`: {method} {url}: TLS failed: {exc}", hint=hint)

    def ensure_scheme(self, deadline: Deadline, read_timeout: float) -> None:
        """Ping `/v2/`: HTTPS first; plain HTTP only for an insecure registry and never after
        a certificate failure. Learns the challenge without sending any credentials."""
        if self.scheme:
            return
        schemes = ["https", "http"] if is_insecure(self.registry) else ["https"]
        for n, scheme in enumerate(schemes):
            try:
                answer = self._open("GET", f"{scheme}://{self.host}/v2/", {}, None,
                                    deadline, read_timeout)
            except (Transient, Refused):
                if n + 1 == len(schemes):
                    raise
                continue
            answer.close()
            self.scheme = scheme
            if answer.status == 401 and answer.headers.get("WWW-Authenticate"):
                self.challenge = parse_challenge(answer.headers["WWW-Authenticate"])
            return

    def authorization(self, scopes: tuple[str, ...], deadline: Deadline,
                      read_timeout: float) -> dict[str, str]:
        """The Authorization header for a request needing `scopes`; {} before any challenge."""
        if self.challenge is None:
            return {}
        kind, params = self.challenge
        creds = self.credentials()
        if kind == "basic":
            if creds is None:
                return {}
            self._refuse_plain_http()
            return {"Authorization": creds.basic()}
        if kind != "bearer":
            raise RegistryError(f"registry `{self.registry}` asks for `{kind}` authentication, "
                                "which this client does not speak (Basic and Bearer only)")
        if creds is not None:  # a token got with them is as secret as they are
            self._refuse_plain_http()
        key = tuple(sorted(set(scopes)))
        token = self.tokens.get(key)
        if token is None or token.expires <= time.monotonic():
            token = self._fetch_token(params, key, deadline, read_timeout)
            self.tokens[key] = token
        return {"Authorization": f"Bearer {token.value}"}

    def _refuse_plain_http(self) -> None:
        if self.scheme == "http" and not is_loopback(self.registry):
            raise RegistryError(f"registry `{self.registry}` speaks plain HTTP: its credentials "
                                "are not sent over it", hint="serve it over HTTPS")

    def _fetch_token(self, params: dict[str, str], scopes: tuple[str, ...], deadline: Deadline,
                     read_timeout: float) -> Token:
        realm = params.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise RegistryError(f"registry `{self.registry}` named no usable token realm "
                                f"(`{shown(realm)}`) in its challenge")
        query = [("service", params["service"])] if params.get("service") else []
        query += [("scope", s) for s in scopes]
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        headers, body, method = {}, None, "GET"
        creds = self.credentials()
        # Credentials only to the registry's own token service, and never over plain HTTP
        # to a host that is not loopback (such a realm is asked anonymously).
        ours = same_domain(split_host(parts.netloc), split_host(self.host)) and (
            parts.scheme == "https" or is_loopback(parts.netloc))
        if creds is not None and ours:
            if creds.identity_token:  # an OAuth2 refresh token: POST it (as Docker does)
                method, url = "POST", realm
                form = [("grant_type", "refresh_token"), ("refresh_token", creds.secret),
                        ("client_id", "torch-images"), *query]
                body = urllib.parse.urlencode(form).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            else:
                headers["Authorization"] = creds.basic()
        answer = self._open(method, url, headers, body, deadline, read_timeout)
        if answer.status != 200:
            problem = (f"refused the credentials from {creds.source}" if creds and ours
                       else "refused an anonymous token")
            raise answer.fail(f"token service {problem} (HTTP {answer.status})")
        doc = answer.json_object(TOKEN_CAP, "token answer")
        value = doc.get("token") or doc.get("access_token")
        expires = doc.get("expires_in", DEFAULT_TOKEN_S)
        if not isinstance(value, str) or not value or not isinstance(expires, int):
            raise answer.fail("the token answer has no `token` string or a bad `expires_in`")
        # Refresh a little early: the token must still be valid when the request arrives.
        return Token(value, time.monotonic() + max(expires, DEFAULT_TOKEN_S // 6) - 5)

    # ---- one request ------------------------------------------------------------------------

    def request(self, method: str, path: str, *, deadline: Deadline,
                read_timeout: float = READ_TIMEOUT_S, scopes: tuple[str, ...] = (),
                headers: dict[str, str] | None = None, body: bytes | None = None,
                absolute: str | None = None) -> Answer:
        """`method` on `/v2/<path>` (or an upload URL the registry gave): credentials only
        after a challenge; one re-try after a new challenge or an expired token; `429` waits
        for its `Retry-After` within the deadline; 5xx raise Transient."""
        self.ensure_scheme(deadline, read_timeout)
        url = absolute or f"{self.base}/v2/{path}"
        challenged = False
        for _ in range(MAX_RETRY_AFTER + 2):
            auth = self.authorization(scopes, deadline, read_timeout)
            answer = self._open(method, url, {**(headers or {}), **auth}, body, deadline,
                                read_timeout)
            if answer.status == 401 and not challenged:
                challenged = True
                self._learn(answer, scopes)
                scopes = self._scopes_with(answer, scopes)
                continue
            if answer.status == 401:
                raise self._refused(answer)
            if answer.status == 429:
                self._wait_retry_after(answer)
                continue
            if answer.status >= 500:
                answer.close()
                raise Transient(f"registry `{self.registry}`: {answer.where}: HTTP "
                                f"{answer.status}")
            return answer
        raise answer.fail(f"still HTTP {answer.status} after {MAX_RETRY_AFTER} waits")

    def _learn(self, answer: Answer, scopes: tuple[str, ...]) -> None:
        value = answer.headers.get("WWW-Authenticate", "")
        answer.close()
        if not value:
            raise answer.fail("HTTP 401 without a WWW-Authenticate challenge")
        self.challenge = parse_challenge(value)
        self.tokens.pop(tuple(sorted(set(scopes))), None)

    def _scopes_with(self, answer: Answer, scopes: tuple[str, ...]) -> tuple[str, ...]:
        asked = parse_challenge(answer.headers.get("WWW-Authenticate", ""))[1].get("scope", "")
        return tuple(sorted({*scopes, *asked.split()}))

    def _refused(self, answer: Answer) -> RegistryError:
        creds = self.credentials()
        _, params = parse_challenge(answer.headers.get("WWW-Authenticate", ""))
        if params.get("error") == "insufficient_scope":
            return answer.fail(f"refused: outside the granted scope ({params.get('scope', '?')})")
        if creds is None:
            error = answer.fail("the registry wants credentials; none found")
            error.hint = ("set REGISTRY_USERNAME and REGISTRY_PASSWORD, or run "
                          f"`docker login {self.registry}`")
            return error
        return answer.fail(f"the registry refused the credentials from {creds.source}")

    def _wait_retry_after(self, answer: Answer) -> None:
        value = answer.headers.get("Retry-After", "1").strip()
        answer.close()
        if value.isdigit():
            wait = float(value)
        else:
            when = email.utils.parsedate_to_datetime(value) if value else None
            wait = when.timestamp() - time.time() if when else 1.0
        wait = max(wait, 0.0)
        if wait >= answer.deadline.left():
            raise answer.fail(f"HTTP 429: `Retry-After: {value}` is past the deadline")
        time.sleep(wait)


_SESSIONS: dict[str, Session] = {}


def session(registry: str) -> Session:
    if registry not in _SESSIONS:
        _SESSIONS[registry] = Session(registry)
    return _SESSIONS[registry]


def forget() -> None:
    """Drop what this process learnt about registries (tests; a changed config)."""
    _SESSIONS.clear()
    forget_pools()
