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
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from builder.core import limits, media, registry_http, settings
from builder.core.oci_blobs import (
    EVIDENCE_CAP,
    BlobMethods,
    DigestMismatch,
    check_digest,
    pull_scope,
    push_scope,
    sha256,
)
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
BACKOFF_S: tuple[float, ...] = (1, 2, 4)  # 4 tries in all
MANIFEST_CAP = 4 << 20  # the distribution spec's suggested limit
LIST_CAP = 4 << 20  # a tag list, a referrers index
MAX_INDEX_CHILDREN = 64
MAX_INDEX_DEPTH = 2  # an index of indexes of manifests, no deeper

T = TypeVar("T")


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


def retry(what: str, registry: str, fn: Callable[[], T],
          transient: tuple[type[Exception], ...] = (),
          backoff: tuple[float, ...] | None = None, deadline: Deadline | None = None) -> T:
    """`fn()` with bounded backoff (never sleeping past `deadline`); the last failure becomes
    a RegistryError naming the registry. `transient` adds exception types worth another try
    (e.g. a failed `docker push`). No `backoff`: BACKOFF_S, read now (a default argument
    would capture it at import, where a test's monkeypatch never reaches)."""
    last: Exception | None = None
    for delay in (*(BACKOFF_S if backoff is None else backoff), None):
        try:
            return fn()
        except registry_http.Refused as exc:  # nothing listens: no point in waiting
            raise RegistryError(f"{what}: {exc}", hint=exc.hint) from None
        except (Transient, OSError, *transient) as exc:
            last = exc
            if delay is None or (deadline is not None and deadline.left() <= delay):
                break
            time.sleep(delay)
    raise RegistryError(f"{what}: registry `{registry}` failed", hint=str(last))


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


class Registry(BlobMethods):
    """One registry host; every method names the repository it works on."""

    def __init__(self, registry: str, timeout: float = TIMEOUT_S,
                 backoff: tuple[float, ...] | None = None, deadline: float | None = None) -> None:
        self.registry = registry
        self.timeout = timeout  # one read
        # () for a question that must not wait (the plan's); BACKOFF_S read now, not at import
        self.backoff = BACKOFF_S if backoff is None else backoff
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
