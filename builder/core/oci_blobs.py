"""The blob half of the registry client (builder.core.oci): read a small blob checked against
its digest, stream a large one in bounded memory (resumed with `Range`), upload in PATCH chunks
(resumed from the offset the registry reports), mount across repositories. Mixed into
oci.Registry, whose `_request` and `_call` it uses; the digest and scope helpers both halves
use live here.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from builder.core import registry_http, settings
from builder.core.errors import FINDINGS
from builder.core.registry_http import Answer, Deadline, RegistryError, Transient

MIN_RATE = 1 << 20  # a streamed blob's deadline grows by one second per MiB
SMALL_RATE = 4 << 20  # a small blob read whole (config, evidence): 1 s more per 4 MiB of cap
CONFIG_CAP = 8 << 20  # an image config (labels, history)
EVIDENCE_CAP = 64 << 20  # an attached SBOM, smoke report or provenance statement
CHUNK = 8 << 20  # one PATCH of a streamed upload (ECR wants >= 5 MiB but for the last)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class UploadBroken(Transient):
    """An upload broke where the registry cannot resume it (distribution 2.8 keeps the bytes
    of a cut PATCH but not its offset): start it again from a fresh source."""


class DigestMismatch(RegistryError):
    """Bytes that do not hash to the digest they were asked for: a forgery or a broken proxy,
    reported as a finding (exit 1) like any other failed check, not as an outage."""

    exit_code = FINDINGS


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(digest: str, where: str) -> str:
    """A digest we are about to put into a URL or compare: sha256 and nothing else."""
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise RegistryError(f"{where}: `{registry_http.shown(str(digest), 80)}` is not a sha256 "
                            "digest")
    return digest


def blob_deadline(size: int) -> float:
    """A streamed blob's overall deadline: the operation's, plus a second per MiB."""
    return settings.current().registry_deadline_s + max(size, 0) / MIN_RATE


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"


def push_scope(repository: str) -> str:
    return f"repository:{repository}:pull,push"


class BlobMethods:
    """Registry's blob methods; `registry`, `backoff`, `deadline`, `session`, `_request` and
    `_call` are Registry's."""

    registry: str
    backoff: tuple[float, ...]
    deadline: float
    session: Any
    _request: Callable[..., Answer]
    _call: Callable[..., Any]

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
