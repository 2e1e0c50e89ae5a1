"""The one client for OCI distribution registries (HTTP API v2).

What the pipeline needs of a registry and nothing more: read a manifest (HEAD/GET), copy an
image between repositories of one registry (blob mount) or of two (blobs streamed once, in
bounded memory), tag a manifest, push a small artifact whose `subject` is an image and find it
again (OCI 1.1 referrers API first, the tag `sha256-<hex>.<kind>` where the registry has no
such API).

Nothing read is trusted: every manifest and blob read by digest is hashed and compared before
use; manifests (4 MiB), configs and evidence have size caps checked while reading; an index
may list at most MAX_INDEX_CHILDREN manifests and nest MAX_INDEX_DEPTH deep; every malformed
answer is a one-line RegistryError naming the registry, the request and the problem (exit 2).
Each operation has an overall deadline (`deadline`, seconds; a blob transfer gets more by
size). Transport, TLS and credentials: builder.core.registry_http and registry_auth; the
wire work (pools, TLS, bodies) is urllib3's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from builder.core import limits, media, registry_http, settings
from builder.core.errors import FINDINGS
from builder.core.registry_http import Answer, Deadline, RegistryError, Transient

# The registry's own types (defined with every other media type in builder.core.media).
OCI_MANIFEST, OCI_INDEX, OCI_CONFIG = media.OCI_MANIFEST, media.OCI_INDEX, media.OCI_CONFIG
DOCKER_MANIFEST, DOCKER_LIST = media.DOCKER_MANIFEST, media.DOCKER_LIST
MANIFEST_TYPES, INDEX_TYPES = media.MANIFEST_TYPES, media.INDEX_TYPES
EMPTY_CONFIG, OCI_LAYER_GZIP = media.EMPTY_CONFIG, media.OCI_LAYER_GZIP
EMPTY_JSON = b"{}"
REF_NAME = "org.opencontainers.image.ref.name"
SUBJECT_ANNOTATION = "io.torch-images.subject"

TIMEOUT_S = 30.0  # one read
MIN_RATE = 1 << 20  # a streamed blob's deadline grows by one second per MiB
SMALL_RATE = 4 << 20  # a small blob read whole (config, evidence): 1 s more per 4 MiB of cap
BACKOFF_S: tuple[float, ...] = (1, 2, 4)  # 4 tries in all
MANIFEST_CAP = 4 << 20  # the distribution spec's suggested limit
CONFIG_CAP = 8 << 20  # an image config (labels, history)
EVIDENCE_CAP = 64 << 20  # an attached SBOM, smoke report or provenance statement
LIST_CAP = 4 << 20  # a tag list, a referrers index
MAX_INDEX_CHILDREN = 64
MAX_INDEX_DEPTH = 2  # an index of indexes of manifests, no deeper
CHUNK = 8 << 20  # one PATCH of a streamed upload (ECR wants >= 5 MiB but for the last)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

T = TypeVar("T")


class UploadBroken(Transient):
    """An upload broke where the registry cannot resume it (distribution 2.8 keeps the bytes
    of a cut PATCH but not its offset): start it again from a fresh source."""


@dataclass(frozen=True)
class Descriptor:
    digest: str
    media_type: str
    size: int

    def as_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def registry_url(registry: str) -> str:
    """The URL `builder registry` serves: plain HTTP on loopback (an insecure registry, as
    Docker has them); the client itself tries HTTPS first everywhere (registry_http)."""
    scheme = "http" if registry_http.is_loopback(registry) else "https"
    return f"{scheme}://{registry}"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def retry(what: str, registry: str, fn: Callable[[], T],
          transient: tuple[type[Exception], ...] = (),
          backoff: tuple[float, ...] = BACKOFF_S, deadline: Deadline | None = None) -> T:
    """`fn()` with bounded backoff (never sleeping past `deadline`); the last failure becomes
    a RegistryError naming the registry. `transient` adds exception types worth another try
    (e.g. a failed `docker push`)."""
    last: Exception | None = None
    for delay in (*backoff, None):
        try:
            return fn()
        except (Transient, OSError, *transient) as exc:
            last = exc
            if delay is None or (deadline is not None and deadline.left() <= delay):
                break
            time.sleep(delay)
    raise RegistryError(f"{what}: registry `{registry}` failed", hint=str(last))


class DigestMismatch(RegistryError):
    """Bytes that do not hash to the digest they were asked for: a forgery or a broken proxy,
    reported as a finding (exit 1) like any other failed check, not as an outage."""

    exit_code = FINDINGS


def check_digest(digest: str, where: str) -> str:
    """A digest we are about to put into a URL or compare: sha256 and nothing else."""
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise RegistryError(f"{where}: `{registry_http.shown(str(digest), 80)}` is not a sha256 "
                            "digest")
    return digest


def _descriptors(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The blobs (config + layers) or children (manifests) a manifest lists, checked."""
    found = []
    for key in ("config", "layers", "manifests", "subject"):
        value = doc.get(key)
        if value is None:
            continue
        items = [value] if key in ("config", "subject") else value
        if not isinstance(items, list):
            raise RegistryError(f"{where}: `{key}` is not a list")
        for n, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("size", 0), int):
                raise RegistryError(f"{where}: `{key}[{n}]` is not a descriptor")
            check_digest(item.get("digest"), f"{where}: `{key}[{n}].digest`")
            if key != "subject":
                found.append({**item, "_kind": key})
    return found


def parse_manifest(body: bytes, where: str) -> dict[str, Any]:
    """The manifest as a checked JSON object (an index within its fan-out bound)."""
    doc = limits.json_object(body, f"{where}: the manifest", RegistryError)
    children = doc.get("manifests")
    if isinstance(children, list) and len(children) > MAX_INDEX_CHILDREN:
        raise RegistryError(f"{where}: the index lists {len(children)} manifests, over the "
                            f"limit of {MAX_INDEX_CHILDREN}")
    _descriptors(doc, where)
    return doc


def blob_deadline(size: int) -> float:
    """A streamed blob's overall deadline: the operation's, plus a second per MiB."""
    return settings.current().registry_deadline_s + max(size, 0) / MIN_RATE


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"


def push_scope(repository: str) -> str:
    return f"repository:{repository}:pull,push"


class Registry:
    """One registry host; every method names the repository it works on."""

    def __init__(self, registry: str, timeout: float = TIMEOUT_S,
                 backoff: tuple[float, ...] = BACKOFF_S, deadline: float | None = None) -> None:
        self.registry = registry
        self.timeout = timeout  # one read
        self.backoff = backoff  # () for a question that must not wait (the plan's)
        # One operation (a manifest, a tag, a small blob); $BUILDER_REGISTRY_DEADLINE_S for slow
        # links (settings.current()).
        self.deadline = deadline or settings.current().registry_deadline_s
        self.session = registry_http.session(registry)

    # ---- HTTP ---------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[Deadline], T], seconds: float | None = None) -> T:
        """`fn(deadline)` under one overall deadline, re-tried while it is transient."""
        deadline = Deadline(seconds or self.deadline)
        return retry(what, self.registry, lambda: fn(deadline), backoff=self.backoff,
                     deadline=deadline)

    def _request(self, method: str, path: str, deadline: Deadline, *,
                 scopes: tuple[str, ...], ok: tuple[int, ...] = (200,),
                 headers: dict[str, str] | None = None, body: bytes | None = None,
                 absolute: str | None = None) -> Answer:
        """An answer with an `ok` status or 404; any other status raises, naming it."""
        answer = self.session.request(method, path, deadline=deadline, scopes=scopes,
                                      headers=headers, body=body, absolute=absolute,
                                      read_timeout=self.timeout)
        if answer.status in ok or answer.status == 404:
            return answer
        detail = registry_http.shown(answer.read(registry_http.ERROR_BODY_CAP, "error answer")
                                     .decode(errors="replace")) if method != "HEAD" else ""
        raise answer.fail(f"refused: HTTP {answer.status}" + (f": {detail}" if detail else ""))

    # ---- manifests ----------------------------------------------------------------------------

    def head(self, repository: str, ref: str) -> Descriptor | None:
        """The descriptor of `ref` (a tag or digest), or None when there is no such manifest."""
        def once(deadline: Deadline) -> Descriptor | None:
            answer = self._request("HEAD", f"{repository}/manifests/{ref}", deadline,
                                   scopes=(pull_scope(repository),),
                                   headers={"Accept": ", ".join(MANIFEST_TYPES)})
            answer.close()
            if answer.status == 404:
                return None
            digest = check_digest(answer.header("Docker-Content-Digest"), answer.where)
            if ref.startswith("sha256:") and digest != ref:
                raise answer.fail(f"answered for {digest}, not for {ref}")
            size = answer.header("Content-Length")
            if not size.isdigit():
                raise answer.fail(f"Content-Length `{registry_http.shown(size, 40)}` is not a size")
            return Descriptor(digest, answer.header("Content-Type").split(";")[0].strip(),
                              int(size))
        return self._call(f"reading `{repository}:{ref}`", once)

    def manifest(self, repository: str, ref: str) -> tuple[bytes, Descriptor] | None:
        """The manifest's exact bytes (digests are over them) and its descriptor, checked: a
        digest `ref` must be the sha256 of the bytes, a tag must match the registry's
        Docker-Content-Digest, the body must be a JSON manifest within MANIFEST_CAP."""
        def once(deadline: Deadline) -> tuple[bytes, Descriptor] | None:
            answer = self._request("GET", f"{repository}/manifests/{ref}", deadline,
                                   scopes=(pull_scope(repository),),
                                   headers={"Accept": ", ".join(MANIFEST_TYPES)})
            if answer.status == 404:
                answer.close()
                return None
            where = f"registry `{self.registry}`: {answer.where}"
            body = answer.read(MANIFEST_CAP, "manifest")
            digest = sha256(body)
            claimed = answer.headers.get("Docker-Content-Digest") or ""
            expected = ref if ref.startswith("sha256:") else claimed
            if expected and digest != expected:
                raise DigestMismatch(f"{where}: the manifest's bytes hash to {digest}, "
                                     f"not {expected}: refused")
            doc = parse_manifest(body, where)
            media_type = (answer.headers.get("Content-Type") or "").split(";")[0].strip() \
                or doc.get("mediaType")
            if not isinstance(media_type, str) or not media_type:
                raise RegistryError(f"{where}: the answer has no Content-Type and the "
                                    "manifest no mediaType")
            return body, Descriptor(digest, media_type, len(body))
        return self._call(f"reading `{repository}:{ref}`", once)

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        """Store `body` under `ref` (a tag, or its own digest); returns its digest."""
        digest = sha256(body)

        def once(deadline: Deadline) -> None:
            answer = self._request("PUT", f"{repository}/manifests/{ref}", deadline,
                                   scopes=(push_scope(repository),), ok=(201,), body=body,
                                   headers={"Content-Type": media_type})
            answer.close()
            if answer.status == 404:
                raise answer.fail("refused: HTTP 404 (a blob or manifest it lists is missing?)")
            stored = answer.headers.get("Docker-Content-Digest")
            if stored and stored != digest:
                raise answer.fail(f"stored the manifest as {stored}, not {digest}")
        self._call(f"writing `{repository}:{ref}`", once)
        return digest

    def tags(self, repository: str) -> list[str]:
        def once(deadline: Deadline) -> list[str]:
            answer = self._request("GET", f"{repository}/tags/list", deadline,
                                   scopes=(pull_scope(repository),))
            if answer.status == 404:
                answer.close()
                return []
            tags = answer.json_object(LIST_CAP, "tag list").get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise answer.fail("`tags` is not a list of strings")
            return sorted(tags)
        return self._call(f"listing the tags of `{repository}`", once)

    # ---- blobs --------------------------------------------------------------------------------

    def has_blob(self, repository: str, digest: str) -> bool:
        check_digest(digest, f"registry `{self.registry}`: blob")

        def once(deadline: Deadline) -> bool:
            answer = self._request("HEAD", f"{repository}/blobs/{digest}", deadline,
                                   scopes=(pull_scope(repository),))
            answer.close()
            return answer.status == 200
        return self._call(f"reading blob {digest[:19]}", once)

    def blob(self, repository: str, digest: str, cap: int = EVIDENCE_CAP) -> bytes:
        """A small blob (a config, an attached file), read up to `cap` and checked against
        its digest."""
        check_digest(digest, f"registry `{self.registry}`: blob")

        def once(deadline: Deadline) -> bytes:
            answer = self._request("GET", f"{repository}/blobs/{digest}", deadline,
                                   scopes=(pull_scope(repository),))
            if answer.status == 404:
                answer.close()
                raise RegistryError(f"registry `{self.registry}`: `{repository}` has no blob "
                                    f"{digest}")
            body = answer.read(cap, "blob")
            if (got := sha256(body)) != digest:
                raise DigestMismatch(f"registry `{self.registry}`: {answer.where}: the blob's "
                                     f"bytes hash to {got}, not {digest}: refused")
            return body
        return self._call(f"reading blob {digest[:19]}", once, self.deadline + cap / SMALL_RATE)

    def config(self, repository: str, digest: str) -> dict[str, Any]:
        """An image config, checked: a JSON object whose `config.Labels` maps str to str."""
        body = self.blob(repository, digest, CONFIG_CAP)
        where = f"registry `{self.registry}`: config {digest[:19]} of `{repository}`"
        try:
            doc = json.loads(body)
        except ValueError:
            raise RegistryError(f"{where}: not JSON") from None
        inner = doc.get("config") or {} if isinstance(doc, dict) else None
        labels = inner.get("Labels") or {} if isinstance(inner, dict) else None
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise RegistryError(f"{where}: `config.Labels` is not a map of strings")
        assert isinstance(doc, dict)
        return doc

    def blob_tail(self, repository: str, digest: str, length: int) -> bytes | None:
        """The last `length` bytes of a blob by an HTTP range request, or None when the
        registry does not serve ranges. A part cannot be checked against the digest: use it
        only for figures shown to people, such as a gzip layer's uncompressed size."""
        check_digest(digest, f"registry `{self.registry}`: blob")

        def once(deadline: Deadline) -> bytes | None:
            answer = self._request("GET", f"{repository}/blobs/{digest}", deadline,
                                   scopes=(pull_scope(repository),), ok=(200, 206),
                                   headers={"Range": f"bytes=-{length}"})
            if answer.status != 206:  # 404, or the whole blob: not read
                answer.close()
                if answer.status == 404:
                    raise RegistryError(f"registry `{self.registry}`: `{repository}` has no "
                                        f"blob {digest}")
                return None
            return answer.read(length, "blob range")
        return self._call(f"reading the end of blob {digest[:19]}", once)

    def labels(self, repository: str, digest: str) -> dict[str, str]:
        return (self.config(repository, digest).get("config") or {}).get("Labels") or {}

    def stream_blob(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes as they arrive (bounded memory), resumed with `Range` after a
        break where the registry allows it; raises at the end unless they hash to `digest`."""
        check_digest(digest, f"registry `{self.registry}`: blob")
        deadline = Deadline(blob_deadline(size))
        hasher, offset = hashlib.sha256(), 0
        for attempt in range(len(self.backoff) + 1):
            headers = {"Range": f"bytes={offset}-"} if offset else {}
            answer = self._request("GET", f"{repository}/blobs/{digest}", deadline,
                                   scopes=(pull_scope(repository),), ok=(200, 206),
                                   headers=headers)
            if answer.status == 404 or (offset and answer.status != 206):
                raise answer.fail("no such blob" if answer.status == 404 else
                                  f"cannot resume at byte {offset} (HTTP {answer.status})")
            try:
                for chunk in answer.chunks():
                    offset += len(chunk)
                    if offset > size:
                        raise answer.fail(f"the blob is longer than its {size} bytes")
                    hasher.update(chunk)
                    yield chunk
                break
            except Transient:
                if attempt == len(self.backoff):
                    raise
        if (got := "sha256:" + hasher.hexdigest()) != digest or offset != size:
            raise RegistryError(f"registry `{self.registry}`: blob {digest} of `{repository}`: "
                                f"the bytes ({offset}) hash to {got}: refused")

    def push_blob(self, repository: str, data: bytes) -> str:
        """Upload a small blob from memory (a blob already there is kept)."""
        digest = sha256(data)
        if not self.has_blob(repository, digest):
            self.upload_again(repository, digest, len(data), lambda: iter([data]))
        return digest

    def upload(self, repository: str, digest: str | None, size: int, chunks: Iterator[bytes],
               location: str | None = None) -> str:
        """Stream a blob in PATCH chunks of at most CHUNK bytes (one chunk in memory), hashing
        as it goes; a PATCH that breaks is resumed from the offset the registry reports. The
        final PUT names the digest (the one computed when `digest` is None), so the registry
        checks it too. Returns the digest."""
        deadline = Deadline(blob_deadline(size))
        scopes = (push_scope(repository),)
        if location is None:
            answer = self._request("POST", f"{repository}/blobs/uploads/", deadline,
                                   scopes=scopes, ok=(202,), body=b"")
            answer.close()
            location = answer.header("Location")
        url = self._absolute(location)
        hasher, offset = hashlib.sha256(), 0
        for chunk in _rechunk(chunks, CHUNK):
            hasher.update(chunk)
            url = self._patch(url, chunk, offset, deadline, scopes)
            offset += len(chunk)
        got = "sha256:" + hasher.hexdigest()
        if digest is not None and got != digest:
            raise RegistryError(f"registry `{self.registry}`: uploading {digest}: the bytes "
                                f"sent hash to {got}: refused")
        answer = self._request("PUT", "", deadline, scopes=scopes, ok=(201,), body=b"",
                               absolute=_with_query(url, digest=got))
        answer.close()
        if answer.status == 404:
            raise answer.fail("the upload session is gone (HTTP 404)")
        return got

    def _patch(self, url: str, chunk: bytes, offset: int, deadline: Deadline,
               scopes: tuple[str, ...]) -> str:
        """PATCH `chunk` at `offset`; after a break, ask where the upload stands and send the
        rest. Returns the next upload URL."""
        start = offset
        for delay in (*self.backoff, None):
            try:
                answer = self._request(
                    "PATCH", "", deadline, scopes=scopes, ok=(202,), absolute=url,
                    body=chunk[start - offset:],
                    headers={"Content-Type": "application/octet-stream",
                             "Content-Range": f"{start}-{offset + len(chunk) - 1}"})
                answer.close()
                return self._absolute(answer.header("Location"))
            except Transient:
                if delay is None or deadline.left() <= delay:
                    raise
                time.sleep(delay)
                start = self._upload_offset(url, deadline, scopes)
                if not offset <= start <= offset + len(chunk):
                    raise UploadBroken(f"registry `{self.registry}`: the upload cannot resume "
                                       f"(it stands at byte {start}, not within "
                                       f"{offset}-{offset + len(chunk)})") from None
        raise AssertionError("unreachable")

    def _upload_offset(self, url: str, deadline: Deadline, scopes: tuple[str, ...]) -> int:
        """Where an interrupted upload stands: `Range: 0-<last byte>` of GET on its URL (-1
        when the registry no longer knows it)."""
        answer = self._request("GET", "", deadline, scopes=scopes, ok=(204,), absolute=url)
        answer.close()
        match = re.fullmatch(r"0-(\d+)", answer.headers.get("Range", ""))
        if answer.status != 204:
            return -1
        return int(match.group(1)) + 1 if match else 0

    def upload_again(self, repository: str, digest: str, size: int,
                     source: Callable[[], Iterator[bytes]], location: str | None = None) -> None:
        """`upload` from `source()`; when the registry cannot resume a broken upload, once
        more from the start with a fresh source (a re-read of memory or of the source
        registry: still one chunk in memory)."""
        try:
            self.upload(repository, digest, size, source(), location)
        except UploadBroken:
            self.upload(repository, digest, size, source())

    def _absolute(self, location: str) -> str:
        url = urllib.parse.urljoin(self.session.base + "/", location)
        if urllib.parse.urlsplit(url).netloc != self.session.host:
            raise RegistryError(f"registry `{self.registry}`: the upload location "
                                f"`{registry_http.shown(url, 100)}` "
                                "is on another host: refused")
        return url

    def mount_blob(self, repository: str, digest: str, source: str, size: int = 0) -> None:
        """Make a blob of `source` available in `repository` without sending its bytes; when
        the registry will not mount, the bytes are streamed through (bounded memory)."""
        if self.has_blob(repository, digest):
            return
        query = urllib.parse.urlencode({"mount": digest, "from": source})
        scopes = (pull_scope(source), push_scope(repository))

        def once(deadline: Deadline) -> Answer:
            answer = self._request("POST", f"{repository}/blobs/uploads/?{query}", deadline,
                                   scopes=scopes, ok=(201, 202), body=b"")
            answer.close()
            return answer
        answer = self._call(f"mounting blob {digest[:19]}", once)
        if answer.status == 202:  # not mounted: copy the bytes into the session it opened
            size = size or self._blob_size(source, digest)
            self.upload_again(repository, digest, size,
                              lambda: self.stream_blob(source, digest, size),
                              location=answer.header("Location"))

    def _blob_size(self, repository: str, digest: str) -> int:
        def once(deadline: Deadline) -> int:
            answer = self._request("HEAD", f"{repository}/blobs/{digest}", deadline,
                                   scopes=(pull_scope(repository),))
            answer.close()
            size = answer.headers.get("Content-Length", "")
            if answer.status == 404 or not size.isdigit():
                raise answer.fail("no such blob, or no size for it")
            return int(size)
        return self._call(f"reading blob {digest[:19]}", once)

    # ---- composite operations -----------------------------------------------------------------

    def tag(self, repository: str, digest: str, tag: str) -> None:
        """Point `tag` at the manifest `digest` already in `repository` (byte-identical PUT)."""
        found = self.manifest(repository, digest)
        if found is None:
            raise RegistryError(f"`{self.registry}/{repository}` has no manifest {digest}")
        body, desc = found
        self.put_manifest(repository, tag, body, desc.media_type)

    def push_index(self, repository: str, index: dict[str, Any]) -> Descriptor:
        """Store an image index (see builder.model.platforms.index_document) by its digest; every
        manifest it lists must already be in `repository`. `tag` then points tags at it."""
        for entry in index["manifests"]:
            if self.head(repository, entry["digest"]) is None:
                raise RegistryError(f"`{self.registry}/{repository}` has no manifest "
                                    f"{entry['digest']} to list in an index")
        body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        digest = self.put_manifest(repository, sha256(body), body, OCI_INDEX)
        return Descriptor(digest, OCI_INDEX, len(body))

    # ---- artifacts and referrers --------------------------------------------------------------

    def push_artifact(self, repository: str, subject: Descriptor, artifact_type: str,
                      data: bytes, *, kind: str, title: str) -> Descriptor:
        """Attach `data` to `subject` as an OCI 1.1 artifact (its manifest names `subject`,
        so a registry with the referrers API lists it); also tagged `sha256-<hex>.<kind>` so
        registries without that API (and people) find it."""
        if len(data) > EVIDENCE_CAP:
            raise RegistryError(f"the {kind} to attach is {len(data)} bytes, over the "
                                f"{EVIDENCE_CAP}-byte limit for evidence")
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
        try:
            digest = self.put_manifest(repository, tag, body, OCI_MANIFEST)
        except RegistryError as exc:
            if not re.search(r"HTTP (400|415)", str(exc)):
                raise
            raise RegistryError(
                f"registry `{self.registry}` refused the {kind} of {subject.digest[:19]} as an "
                "OCI 1.1 artifact (a manifest with `subject` and `artifactType`): it supports "
                "neither the referrers API nor its tag fallback", hint=str(exc)) from None
        return Descriptor(digest, OCI_MANIFEST, len(body))

    def referrers(self, repository: str, digest: str,
                  artifact_type: str | None = None) -> list[dict[str, Any]] | None:
        """The descriptors the referrers API lists for `digest` (filtered by `artifact_type`),
        or None when the registry has no referrers API (404 on the endpoint)."""
        check_digest(digest, f"registry `{self.registry}`: referrers")
        query = "?" + urllib.parse.urlencode({"artifactType": artifact_type}) \
            if artifact_type else ""

        def once(deadline: Deadline) -> list[dict[str, Any]] | None:
            answer = self._request("GET", f"{repository}/referrers/{digest}{query}", deadline,
                                   scopes=(pull_scope(repository),))
            if answer.status == 404:
                answer.close()
                return None
            doc = answer.json_object(LIST_CAP, "referrers index")
            where = f"registry `{self.registry}`: {answer.where}"
            listed = doc.get("manifests") or []
            if not isinstance(listed, list) or len(listed) > 10 * MAX_INDEX_CHILDREN:
                raise RegistryError(f"{where}: `manifests` is not a list of at most "
                                    f"{10 * MAX_INDEX_CHILDREN} descriptors")
            _descriptors({"manifests": listed}, where)
            return [m for m in listed
                    if not artifact_type or m.get("artifactType") == artifact_type]
        return self._call(f"listing the referrers of {digest[:19]}", once)

    def fetch_artifact(self, repository: str, subject_digest: str, kind: str,
                       artifact_type: str | None = None) -> bytes | None:
        """The payload attached to `subject_digest` as `kind`: found through the referrers
        API when the registry serves it, else through its fallback tag."""
        tag = artifact_tag(subject_digest, kind)
        listed = self.referrers(repository, subject_digest, artifact_type)
        if listed is None:
            ref: str | None = tag
        else:
            ours = [m["digest"] for m in listed if (m.get("annotations") or {}).get(REF_NAME)
                    == tag]
            ref = self._newest(repository, tag, ours)
        found = self.manifest(repository, ref) if ref else None
        if found is None:
            return None
        doc = json.loads(found[0])
        layers = doc.get("layers") or []
        if (doc.get("subject") or {}).get("digest") != subject_digest or not layers:
            return None
        return self.blob(repository, layers[0]["digest"], EVIDENCE_CAP)

    def _newest(self, repository: str, tag: str, digests: list[str]) -> str | None:
        """Of several artifacts of one kind, the one its tag points at (the latest attached)."""
        if len(digests) <= 1:
            return digests[0] if digests else None
        current = self.head(repository, tag)
        return current.digest if current and current.digest in digests else digests[-1]


def _rechunk(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """Pieces of at most `size` bytes (and at least `size` but for the last)."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


def _with_query(url: str, **params: str) -> str:
    return url + ("&" if "?" in url else "?") + urllib.parse.urlencode(params)


def promote(source: Registry, source_repository: str, target: Registry, repository: str,
            digest: str, _depth: int = 0, _seen: frozenset[str] = frozenset()) -> Descriptor:
    """Copy `source_repository@digest` (an image or an index, with every blob) into
    `target`/`repository` by digest. On one registry blobs are mounted; across registries each
    missing blob is streamed once from source to target in bounded memory."""
    if digest in _seen or _depth > MAX_INDEX_DEPTH:
        raise RegistryError(f"`{source.registry}/{source_repository}`: index {digest[:19]} "
                            f"nests deeper than {MAX_INDEX_DEPTH} or lists itself")
    found = source.manifest(source_repository, digest)
    if found is None:
        raise RegistryError(f"`{source.registry}/{source_repository}` has no manifest {digest}")
    body, desc = found
    if (there := target.head(repository, digest)) is not None:
        return there
    doc = json.loads(body)
    for item in _descriptors(doc, f"`{source.registry}/{source_repository}@{digest}`"):
        if item["_kind"] == "manifests":
            promote(source, source_repository, target, repository, item["digest"],
                    _depth + 1, _seen | {digest})
        elif target.registry == source.registry:
            target.mount_blob(repository, item["digest"], source_repository,
                              item.get("size", 0))
        elif not target.has_blob(repository, item["digest"]):
            size = item.get("size", 0)
            target.upload_again(repository, item["digest"], size, functools.partial(
                source.stream_blob, source_repository, item["digest"], size))
    target.put_manifest(repository, digest, body, desc.media_type)
    return desc


def artifact_tag(subject_digest: str, kind: str) -> str:
    return f"{subject_digest.replace(':', '-')}.{kind}"
