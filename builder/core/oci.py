"""The one client for OCI distribution registries (HTTP API v2), on the standard library.

What the pipeline needs of a registry and nothing more: read a manifest (HEAD/GET), copy one
between repositories (blob mount + manifest PUT), tag a manifest, push a small artifact whose
`subject` is an image (OCI 1.1 referrers, with a tag `sha256-<hex>.<kind>` as the fallback for
registries without the referrers API) and read it back.

Credentials: `REGISTRY_USERNAME`/`REGISTRY_PASSWORD` (basic, or exchanged for a bearer token
when the registry asks for one). They live in memory only; never written or printed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from builder.core.errors import CommandFailed

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST, DOCKER_LIST)
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
EMPTY_JSON = b"{}"
REF_NAME = "org.opencontainers.image.ref.name"
SUBJECT_ANNOTATION = "io.torch-images.subject"
TIMEOUT_S = 30.0
BACKOFF_S: tuple[float, ...] = (1, 2, 4)  # 4 tries in all

T = TypeVar("T")


class RegistryError(CommandFailed):
    """A registry did not answer or refused an operation (exit 2: could not run)."""


class _Transient(Exception):
    """An answer worth retrying: a refused connection, a timeout, a 5xx."""


@dataclass(frozen=True)
class Descriptor:
    digest: str
    media_type: str
    size: int

    def as_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def registry_url(registry: str) -> str:
    """Loopback registries speak plain http (as Docker allows); everything else https."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    scheme = "http" if host in ("localhost", "127.0.0.1") else "https"
    return f"{scheme}://{registry}"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def retry(what: str, registry: str, fn: Callable[[], T],
          transient: tuple[type[Exception], ...] = (),
          backoff: tuple[float, ...] = BACKOFF_S) -> T:
    """`fn()` with bounded backoff; the last failure becomes a RegistryError naming the registry.
    `transient` adds exception types worth another try (e.g. a failed `docker push`)."""
    last: Exception | None = None
    for delay in (*backoff, None):
        try:
            return fn()
        except (_Transient, OSError, *transient) as exc:
            last = exc
            if delay is not None:
                time.sleep(delay)
    raise RegistryError(f"{what}: registry `{registry}` failed after {len(backoff) + 1} tries",
                        hint=getattr(last, "hint", None) or str(last))


class Registry:
    """One registry host; every method names the repository it works on."""

    def __init__(self, registry: str, timeout: float = TIMEOUT_S,
                 backoff: tuple[float, ...] = BACKOFF_S) -> None:
        self.registry = registry
        self.base = registry_url(registry)
        self.timeout = timeout
        self.backoff = backoff  # () for a question that must not wait (the plan's)
        self._token: str | None = None

    # ---- HTTP ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, data: bytes | None = None,
                 headers: dict[str, str] | None = None, ok: tuple[int, ...] = (200,),
                 absolute: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request (re-sent once with credentials when the registry asks for them).
        Returns (status, headers, body); `ok` statuses return, 404 returns, others raise."""
        url = absolute or f"{self.base}/v2/{path}"
        for attempt in range(2):
            request = urllib.request.Request(url, data=data, method=method,
                                             headers={**(headers or {}), **self._auth()})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return response.status, dict(response.headers), response.read()
            except urllib.error.HTTPError as exc:
                body = exc.read()
                if exc.code in ok or exc.code == 404:
                    return exc.code, dict(exc.headers), body
                if exc.code == 401 and attempt == 0 and self._login(exc.headers):
                    continue
                if exc.code >= 500 or exc.code == 429:
                    raise _Transient(f"{method} {url}: HTTP {exc.code}") from None
                raise RegistryError(
                    f"registry `{self.registry}` refused {method} {url}: HTTP {exc.code}",
                    hint=body[:300].decode(errors="replace") or None) from None
            except urllib.error.URLError as exc:
                raise _Transient(f"{method} {url}: {exc.reason}") from None
        raise RegistryError(f"registry `{self.registry}` wants credentials",
                            hint="set REGISTRY_USERNAME and REGISTRY_PASSWORD")

    def _auth(self) -> dict[str, str]:
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        user, password = os.environ.get("REGISTRY_USERNAME"), os.environ.get("REGISTRY_PASSWORD")
        if user and password:
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}
        return {}

    def _login(self, headers: Any) -> bool:
        """Fetch a bearer token when the challenge asks for one; False when it cannot help."""
        challenge = headers.get("WWW-Authenticate", "")
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(urllib.parse.parse_qsl(
            challenge[7:].replace('"', "").replace(",", "&"), keep_blank_values=True))
        realm = params.pop("realm", "")
        if not realm:
            return False
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers=self._auth())
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            answer = json.loads(response.read())
        self._token = answer.get("token") or answer.get("access_token")
        return bool(self._token)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return retry(what, self.registry, fn, backoff=self.backoff)

    # ---- manifests ----------------------------------------------------------------------------

    def head(self, repository: str, ref: str) -> Descriptor | None:
        """The descriptor of `ref` (a tag or digest), or None when there is no such manifest."""
        def once() -> Descriptor | None:
            status, headers, _ = self._request(
                "HEAD", f"{repository}/manifests/{ref}",
                headers={"Accept": ", ".join(MANIFEST_TYPES)})
            if status == 404:
                return None
            return Descriptor(headers["Docker-Content-Digest"],
                              headers["Content-Type"].split(";")[0],
                              int(headers["Content-Length"]))
        return self._call(f"reading `{repository}:{ref}`", once)

    def manifest(self, repository: str, ref: str) -> tuple[bytes, Descriptor] | None:
        """The manifest's exact bytes (digests are over them) and its descriptor."""
        def once() -> tuple[bytes, Descriptor] | None:
            status, headers, body = self._request(
                "GET", f"{repository}/manifests/{ref}",
                headers={"Accept": ", ".join(MANIFEST_TYPES)})
            if status == 404:
                return None
            return body, Descriptor(sha256(body), headers["Content-Type"].split(";")[0],
                                    len(body))
        return self._call(f"reading `{repository}:{ref}`", once)

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        """Store `body` under `ref` (a tag, or its own digest); returns its digest."""
        self._call(f"writing `{repository}:{ref}`", lambda: self._request(
            "PUT", f"{repository}/manifests/{ref}", data=body,
            headers={"Content-Type": media_type}, ok=(201,)))
        return sha256(body)

    def tags(self, repository: str) -> list[str]:
        def once() -> list[str]:
            status, _, body = self._request("GET", f"{repository}/tags/list")
            return [] if status == 404 else sorted(json.loads(body).get("tags") or [])
        return self._call(f"listing the tags of `{repository}`", once)

    # ---- blobs --------------------------------------------------------------------------------

    def has_blob(self, repository: str, digest: str) -> bool:
        return self._call(f"reading blob {digest[:19]}", lambda: self._request(
            "HEAD", f"{repository}/blobs/{digest}")[0] == 200)

    def blob(self, repository: str, digest: str) -> bytes:
        def once() -> bytes:
            status, _, body = self._request("GET", f"{repository}/blobs/{digest}")
            if status == 404 or sha256(body) != digest:
                raise RegistryError(f"`{repository}` has no blob {digest}")
            return body
        return self._call(f"reading blob {digest[:19]}", once)

    def push_blob(self, repository: str, data: bytes) -> str:
        """Monolithic upload (POST, then PUT with the digest); a blob already there is kept."""
        digest = sha256(data)
        if self.has_blob(repository, digest):
            return digest

        def once() -> None:
            _, headers, _ = self._request("POST", f"{repository}/blobs/uploads/", data=b"",
                                          ok=(202,))
            self._request("PUT", "", absolute=self._upload_url(headers["Location"], digest),
                          data=data, headers={"Content-Type": "application/octet-stream"},
                          ok=(201,))
        self._call(f"pushing blob {digest[:19]}", once)
        return digest

    def mount_blob(self, repository: str, digest: str, source: str) -> None:
        """Make a blob of `source` available in `repository` without sending its bytes."""
        if self.has_blob(repository, digest):
            return
        path = f"{repository}/blobs/uploads/?mount={digest}&from={source}"
        status, _, _ = self._call(f"mounting blob {digest[:19]}", lambda: self._request(
            "POST", path, data=b"", ok=(201, 202)))
        if status == 202:  # the registry would not mount: copy the bytes
            self.push_blob(repository, self.blob(source, digest))

    def _upload_url(self, location: str, digest: str) -> str:
        url = urllib.parse.urljoin(self.base + "/", location)
        return url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})

    # ---- composite operations -----------------------------------------------------------------

    def copy(self, source: str, repository: str, digest: str) -> Descriptor:
        """Copy the manifest `source@digest` (and its blobs) into `repository`, by digest only:
        nothing a user reads by tag changes."""
        found = self.manifest(source, digest)
        if found is None:
            raise RegistryError(f"`{self.registry}/{source}` has no manifest {digest}")
        body, desc = found
        doc = json.loads(body)
        for blob in [doc.get("config") or {}, *doc.get("layers", [])]:
            if blob.get("digest"):
                self.mount_blob(repository, blob["digest"], source)
        for child in doc.get("manifests", []):  # an index: copy each platform's manifest
            self.copy(source, repository, child["digest"])
        self.put_manifest(repository, digest, body, desc.media_type)
        return desc

    def tag(self, repository: str, digest: str, tag: str) -> None:
        """Point `tag` at the manifest `digest` already in `repository` (byte-identical PUT)."""
        found = self.manifest(repository, digest)
        if found is None:
            raise RegistryError(f"`{self.registry}/{repository}` has no manifest {digest}")
        body, desc = found
        self.put_manifest(repository, tag, body, desc.media_type)

    def push_index(self, repository: str, index: dict[str, Any]) -> Descriptor:
        """Store an image index (see builder.platforms.index_document) by its digest; every
        manifest it lists must already be in `repository`. `tag` then points tags at it."""
        for entry in index["manifests"]:
            if self.head(repository, entry["digest"]) is None:
                raise RegistryError(f"`{self.registry}/{repository}` has no manifest "
                                    f"{entry['digest']} to list in an index")
        body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        digest = self.put_manifest(repository, sha256(body), body, OCI_INDEX)
        return Descriptor(digest, OCI_INDEX, len(body))

    def push_artifact(self, repository: str, subject: Descriptor, artifact_type: str,
                      data: bytes, *, kind: str, title: str) -> Descriptor:
        """Attach `data` to `subject` as an OCI 1.1 artifact; also tagged `sha256-<hex>.<kind>`
        so registries without the referrers API (and people) can find it."""
        tag = artifact_tag(subject.digest, kind)
        config = self.push_blob(repository, EMPTY_JSON)
        layer = self.push_blob(repository, data)
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
            "config": {"mediaType": EMPTY_CONFIG, "digest": config, "size": len(EMPTY_JSON)},
            "layers": [{"mediaType": artifact_type, "digest": layer, "size": len(data),
                        "annotations": {"org.opencontainers.image.title": title}}],
            "subject": subject.as_json(),
            "annotations": {REF_NAME: tag, SUBJECT_ANNOTATION: subject.digest},
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        digest = self.put_manifest(repository, tag, body, OCI_MANIFEST)
        return Descriptor(digest, OCI_MANIFEST, len(body))

    def fetch_artifact(self, repository: str, subject_digest: str, kind: str) -> bytes | None:
        """The payload attached to `subject_digest` as `kind`, through its fallback tag."""
        found = self.manifest(repository, artifact_tag(subject_digest, kind))
        if found is None:
            return None
        doc = json.loads(found[0])
        if (doc.get("subject") or {}).get("digest") != subject_digest or not doc.get("layers"):
            return None
        return self.blob(repository, doc["layers"][0]["digest"])


def artifact_tag(subject_digest: str, kind: str) -> str:
    return f"{subject_digest.replace(':', '-')}.{kind}"
