"""The catalog's facts, read from the registry alone: `catalog.json` (see its schema).

Input is one vetted repository (`REGISTRY/REPOSITORY`); nothing from a checkout, `.state/` or
the matrix. Its tag list says nearly everything: floating tags, their dated tags
(`<floating>-YYYYMMDD[.n]`), `build-<hash>` tags and the fallback tags of the evidence attached
to each digest (`sha256-<hex>.sbom|smoke|provenance|audit|rebuild`, cosign's `.sig`, `.att`).
Each tag is resolved to a digest with one HEAD; what a digest names never changes, so every
manifest, config and artifact read is cached by its digest, and a second run fetches only new
digests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import clock, keyless, keypair, oci, sign, state, vouch
from builder.core.errors import BuilderError
from builder.model import catalog_unreadable, layer_reuse, provenance_doc
from builder.model.catalog_doc import (
    REFERRERS,
    SCHEMA_VERSION,
    TWIN_SUFFIX,
    TagSet,
    audit_state,
    audit_summary,
    classify,
    dated_key,
    download_href,
    facts_from_labels,
    layer_groups,
    other_tags,
    platform_name,
    public_keys,
    rebuild_summary,
    run_config,
    sbom_summary,
    signature_summary,
    smoke_summary,
    variants,
)

CACHE_VERSION = 4
WORKERS = 8  # parallel registry requests; loopback and remote registries both serve this many

EVIDENCE_KINDS = ("sbom", "smoke", "provenance", "audit", "rebuild")
# What `builder publish` attaches to a digest before any tag points at it and never replaces:
# read once per image digest, so a run with nothing new does not even ask for their tags. An
# audit, a rebuild reason and signatures may be added later: their tags are asked every run.
ATTACHED_ONCE = ("sbom", "smoke", "provenance")
# What a page offers for download, by kind (the others are summarised only).
DOWNLOADS = ("sbom", "smoke", "provenance")


@dataclass(frozen=True)
class Source:
    registry: str
    repository: str

    @classmethod
    def parse(cls, text: str) -> Source:
        registry, _, repository = text.strip().partition("/")
        if not registry or not repository or "@" in repository or ":" in repository:
            raise BuilderError(f"`{text}` is not REGISTRY/REPOSITORY",
                             hint="e.g. 127.0.0.1:5000/torch (the vetted repository, no tag)")
        return cls(registry, repository)

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"


# ---- the cache --------------------------------------------------------------------------------


class Cache:
    """Facts keyed by digest (manifests, artifacts) and uncompressed layer sizes, in one JSON
    file; a digest's facts never change, so an entry is never refreshed, only added."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, dict[str, Any]] = {"manifests": {}, "artifacts": {}, "layers": {},
                                                "verified": {}, "attached": {}, "keyless": {}}
        if path and path.is_file():
            try:
                doc = json.loads(path.read_text())
                if doc.get("version") == CACHE_VERSION:
                    self.data.update({k: doc.get(k) or {} for k in self.data})
            except ValueError:
                pass  # a damaged cache is only a slower run
        self.fetched = 0

    def get(self, table: str, digest: str, fetch: Callable[[], Any]) -> Any:
        if digest not in self.data[table]:  # None is an answer too (e.g. a size unknown)
            self.data[table][digest] = fetch()
            self.fetched += 1
        return self.data[table][digest]

    def save(self) -> None:
        if self.path and self.fetched:
            state.atomic_write(self.path, json.dumps({"version": CACHE_VERSION, **self.data},
                                                     separators=(",", ":")))


def add_twins(reader: Reader, out: list[dict[str, Any]], images: dict[str, dict[str, Any]],
              twins: dict[str, str]) -> None:
    """Each variant and each dated build whose tag has a `<tag>-zstd` twin names it, with both
    sizes (what a node downloads: the first platform's layers and config): every page's pod
    pins its own twin, an older dated page's too."""
    for entry in [*out, *(h for v in out for h in v["history"])]:
        digest = twins.get(entry["tag"] + TWIN_SUFFIX)
        image = images.get(entry["digest"] or "")
        if digest is not None and image is not None and image["platforms"]:
            entry["zstd"] = twin_facts(reader, entry["tag"], digest, image)


def twin_facts(reader: Reader, tag: str, digest: str, image: dict[str, Any]) -> dict[str, Any]:
    top = reader.manifest(digest)
    first = (top.get("children") or [{"digest": digest}])[0]["digest"]
    facts = reader.manifest(first)
    return {"tag": tag + TWIN_SUFFIX, "digest": digest,
            "size": sum(x["size"] for x in facts["layers"]) + facts["config_size"],
            "gzip_size": image["platforms"][0]["size"]}


def twin_layers(reader: Reader, by_tag: dict[str, str],
                twins: dict[str, str]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """gzip image digest → platform → the layers of its `<tag>-zstd` twin (read in parallel,
    each manifest checked against its digest as every read is)."""
    pairs = {digest: twins[tag + TWIN_SUFFIX] for tag, digest in sorted(by_tag.items())
             if tag + TWIN_SUFFIX in twins}
    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(pairs, pool.map(lambda d: platform_layers(reader, d), pairs.values()),
                        strict=True))


def platform_layers(reader: Reader, digest: str) -> dict[str, list[dict[str, Any]]]:
    """platform → layers of a manifest or of each manifest of an index."""
    top = reader.manifest(digest)
    children = top.get("children") or [{"digest": digest, "platform": top["platform"]}]
    return {c["platform"]: reader.manifest(c["digest"])["layers"] for c in children}


# ---- reading one image ------------------------------------------------------------------------


class Reader:
    """Reads manifests, configs and artifacts of one repository through the cache."""

    def __init__(self, source: Source, cache: Cache, site: Path, keys: list[Any],
                 trusted_root: Path = keyless.PUBLIC_GOOD_ROOT, identities: tuple = ()) -> None:
        self.source, self.cache, self.site, self.keys = source, cache, site, keys
        self.trusted_root, self.identities = trusted_root, identities
        self.reg = oci.Registry(source.registry)

    def resolve(self, tags: list[str]) -> dict[str, str]:
        """tag → digest (one HEAD each, in parallel); a tag deleted meanwhile is left out."""
        def head(tag: str) -> tuple[str, str | None]:
            desc = self.reg.head(self.source.repository, tag)
            return tag, desc.digest if desc else None
        with ThreadPoolExecutor(WORKERS) as pool:
            return {t: d for t, d in pool.map(head, tags) if d}

    def manifest(self, digest: str) -> dict[str, Any]:
        """The facts of an image manifest or index (its platforms' manifests included)."""
        return self.cache.get("manifests", digest, lambda: self._read_manifest(digest))

    def _read_manifest(self, digest: str) -> dict[str, Any]:
        found = self.reg.manifest(self.source.repository, digest)
        if found is None:
            raise oci.RegistryError(f"`{self.source.name}` has no manifest {digest}")
        body, desc = found
        if desc.digest != digest:
            raise oci.RegistryError(f"`{self.source.name}` sent another manifest for {digest}")
        doc = json.loads(body)
        if desc.media_type in (oci.OCI_INDEX, oci.DOCKER_LIST):
            children = [c for c in doc.get("manifests", [])
                        if (c.get("platform") or {}).get("architecture") not in (None, "unknown")]
            return {"media_type": desc.media_type,
                    "children": [{"digest": c["digest"], "platform": platform_name(c["platform"])}
                                 for c in children]}
        config_desc = doc.get("config") or {}
        config = self.reg.config(self.source.repository, config_desc["digest"])
        return {"media_type": desc.media_type, "platform": platform_name(config),
                "labels": (config.get("config") or {}).get("Labels") or {},
                "created": config.get("created"),
                "config": run_config(config.get("config") or {}),
                "config_size": config_desc.get("size", 0),
                "layers": [{"digest": layer["digest"], "size": layer.get("size", 0),
                            "media_type": layer.get("mediaType", "")}
                           for layer in doc.get("layers", [])],
                "history": [h.get("created_by", "") for h in config.get("history") or []
                            if not h.get("empty_layer")]}

    def uncompressed(self, layer: dict[str, Any]) -> int | None:
        """A gzip layer's size unpacked, from the gzip trailer (ISIZE, the size modulo 2³²: the
        smallest value ≥ the compressed size is taken); None for other compressions."""
        if not layer["media_type"].endswith("gzip"):
            return None
        def read() -> int | None:
            tail = self.reg.blob_tail(self.source.repository, layer["digest"], 4)
            if tail is None or len(tail) != 4:
                return None  # no range requests here: unknown, not guessed
            isize = int.from_bytes(tail, "little")
            while isize < layer["size"] - 64:  # gzip's header and trailer are about 20 bytes
                isize += 1 << 32
            return isize
        return self.cache.get("layers", layer["digest"], read)

    def artifact(self, tag: str, artifact_digest: str, kind: str, subject: str) -> dict[str, Any]:
        """The summary of an attached artifact (its payload kept in the site when offered for
        download)."""
        def read() -> dict[str, Any]:
            data = self._payload(tag, subject, kind)
            if data is None:
                return {"present": False}
            if kind in DOWNLOADS:
                state.atomic_write(self.download_path(subject, kind), data)
            summary = summarise(kind, data, subject)
            return {"present": "error" not in summary, **summary}
        summary = self.cache.get("artifacts", artifact_digest, read)
        if summary.get("present") and kind in DOWNLOADS and not self.download_path(
                subject, kind).exists():  # a new site folder with an old cache
            data = self._payload(tag, subject, kind)
            if data is not None:
                state.atomic_write(self.download_path(subject, kind), data)
        return summary

    def _payload(self, tag: str, subject: str, kind: str) -> bytes | None:
        if kind in ("sig", "att"):  # cosign: what counts is in the manifest's annotations
            found = self.reg.manifest(self.source.repository, tag)
            return found[0] if found else None
        return self.reg.fetch_artifact(self.source.repository, subject, kind)

    def download_path(self, subject: str, kind: str) -> Path:
        return self.site / download_href(subject, kind)


# ---- artifact summaries -----------------------------------------------------------------------


def summarise(kind: str, data: bytes, subject: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        return {"error": "not JSON"}
    if not isinstance(doc, dict):
        return {"error": "not a JSON object"}
    summarize = {"sbom": sbom_summary, "smoke": smoke_summary, "audit": audit_summary,
                 "provenance": lambda d: provenance_summary(d, subject),
                 "rebuild": rebuild_summary, "sig": signature_summary,
                 "att": signature_summary}[kind]
    try:
        return {**summarize(doc), "bytes": len(data)}
    except (AttributeError, TypeError, KeyError, ValueError) as exc:  # another shape
        return {"error": f"unexpected content ({type(exc).__name__}: {exc})"[:200]}


def provenance_summary(doc: dict[str, Any], subject: str) -> dict[str, Any]:
    predicate = doc.get("predicate") or {}
    definition = predicate.get("buildDefinition") or {}
    params = definition.get("externalParameters") or {}
    roles = provenance_doc.dependencies_by_role(doc)
    lock = (roles.get("lock") or {}).get("digest", {}).get("sha256")
    base = (roles.get("base") or {}).get("digest", {}).get("sha256")
    subjects = [s.get("digest", {}).get("sha256") for s in doc.get("subject") or []]
    return {"commit": params.get("revision") or None, "source": params.get("source") or None,
            "lock_hash": lock, "base_digest": f"sha256:{base}" if base else None,
            "builder": ((predicate.get("runDetails") or {}).get("builder") or {}).get("id"),
            "subject_matches": subject.removeprefix("sha256:") in subjects}


def signature_status(reader: Reader, digest: str, tags: TagSet, digests: dict[str, str],
                     keys: list[Any]) -> dict[str, Any]:
    """What is signed about `digest`: cosign signatures and signed attestations as present and,
    with `keys`, whether they verify (cached per signature manifest and key)."""
    found = {kind: evidence(reader, digest, kind, tags, digests) for kind in ("sig", "att")}
    out: dict[str, Any] = {"present": found["sig"].get("present", False),
                           "signatures": found["sig"].get("count", 0),
                           "keyless": found["sig"].get("keyless", False),
                           "attestations": found["att"].get("predicate_types", []),
                           "verified": None, "detail": None}
    if signers := keyless_signers(reader, digest, tags, digests):
        out["identities"] = signers
    if not keys or not out["present"]:
        return out
    key = "|".join([*(digests.get(tags.artifacts.get((digest, k), ""), "") for k in found),
                    *(keypair.key_id(k) for k in keys)])
    return {**out, **reader.cache.get("verified", key, lambda: verify_signed(
        reader, digest, keys))}


def keyless_signers(reader: Reader, digest: str, tags: TagSet, digests: dict[str, str]
                    ) -> list[dict[str, Any]]:
    """Who signed the image's sigstore bundles, each verified against the trusted root (any
    identity: the page shows who; `trusted`: one given names it); cached by referrers index."""
    if (index := digests.get(tags.artifacts.get((digest, REFERRERS), ""))) is None:
        return []

    def read() -> list[dict[str, str]]:
        anyone = keyless.KeylessPolicy(trusted_root=reader.trusted_root, any_identity=True)
        return [{"subject": x.subject, "issuer": x.issuer} for x in keyless.verified_signers(
            reader.reg, reader.source.repository, digest, anyone)]

    found = reader.cache.get("keyless", f"{digest}|{index}|{reader.trusted_root}", read)
    return [{**x, "trusted": keyless.trusts(reader.identities, keyless.Signer(**x))} for x in found]


def verify_signed(reader: Reader, digest: str, keys: list[Any]) -> dict[str, Any]:
    repo = reader.source.repository
    try:
        back = sign.rollbacks(sign.verified_payloads(reader.reg, repo, digest, keys))
    except sign.SignatureError as exc:
        return {"verified": False, "detail": str(exc)}
    detail = sign.signature_line(digest, keys) + "".join(
        f"; a signed rollback to `{to}` from `{since}`, made by that key" for to, since in back)
    attested, _ = sign.verified_attestations(reader.reg, repo, digest, keys)
    if attested:
        detail += f"; verified attestations: {', '.join(sorted(attested))}"
    return {"verified": True, "detail": detail}


def signed_dated(reader: Reader, by_tag: dict[str, str]) -> dict[str, str]:
    """With trusted keys or identities, `by_tag` less the dated tags no trusted signature of
    their digest names (builder.core.vouch): anyone with push rights may write a tag, so those
    are no history (they are listed under other tags); without, every tag."""
    trusted = keypair.Vouchers(tuple(reader.keys), reader.identities, reader.trusted_root)
    if not trusted:
        return by_tag
    signed: dict[str, set[str]] = {}
    for digest in {d for t, d in by_tag.items() if dated_key(t)}:
        try:
            signed[digest] = vouch.tags_signed_by(reader.reg, reader.source.repository, digest,
                                                  trusted)
        except sign.SignatureError:
            signed[digest] = set()
    return {t: d for t, d in by_tag.items() if not dated_key(t) or t in signed[d]}


# ---- the catalog ------------------------------------------------------------------------------


def collect(source: Source, site: Path, cache_path: Path | None, *, keys: list[Any] | None = None,
            progress: Callable[[str], None] = lambda _: None,
            trusted_root: Path = keyless.PUBLIC_GOOD_ROOT, identities: tuple = ()
            ) -> tuple[dict[str, Any], int]:
    """(the catalog document, how many digests were fetched: 0 when nothing was new). `keys`:
    cosign public keys to verify signatures with (without, their presence is reported); with
    `identities` they decide which dated tags are history; bundles chain to `trusted_root`."""
    cache = Cache(cache_path)
    reader = Reader(source, cache, site, keys or [], trusted_root, identities)
    tags = classify(reader.reg.tags(source.repository))
    if not tags.images:
        raise BuilderError(f"`{source.name}` has no image tags",
                           hint="publish first (builder publish), or check the repository name")
    progress(f"catalog: {len(tags.images)} tags, {len(tags.artifacts)} attached artifacts")
    known = cache.data["attached"]  # evidence attached once, already read: no HEAD for it
    digests = reader.resolve(tags.images + sorted(
        tag for (subject, kind), tag in tags.artifacts.items()
        if kind not in ATTACHED_ONCE or f"{subject}|{kind}" not in known))
    digests |= {tag: known[f"{subject}|{kind}"] for (subject, kind), tag in tags.artifacts.items()
                if tag not in digests and f"{subject}|{kind}" in known}
    by_tag = {t: digests[t] for t in tags.images if t in digests}
    with ThreadPoolExecutor(WORKERS) as pool:
        images = dict(zip(set(by_tag.values()), pool.map(
            lambda d: readable_facts(reader, d, tags, digests), set(by_tag.values())),
            strict=True))
    unreadable = [catalog_unreadable.entry(d, [t for t, x in by_tag.items() if x == d], why)
                  for d, why in sorted((d, i["unreadable"]) for d, i in images.items()
                                       if "unreadable" in i)]
    images = {d: i for d, i in images.items() if "unreadable" not in i}
    by_tag = {t: d for t, d in by_tag.items() if d in images}
    listed = variants(signed_dated(reader, by_tag), images)
    twins = reader.resolve(tags.twins)
    add_twins(reader, listed, images, twins)
    layer_reuse.add_pulls(listed, images, twin_layers(reader, by_tag, twins))
    cache.save()  # after the twins: their manifests are cached too
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": clock.iso(),
        "registry": source.registry, "repository": source.repository,
        "tags": dict(sorted(by_tag.items())),
        "images": dict(sorted(images.items())),
        "variants": listed,
        **({"other_tags": others} if (others := other_tags(by_tag, listed)) else {}),
        "public_keys": public_keys(keys or []),
        **({"unreadable": unreadable} if unreadable else {}),
    }
    for image in images.values():  # the changelogs are made: the SBOM itself is downloadable
        for platform in image["platforms"]:
            platform["evidence"]["sbom"].pop("components", None)
    return doc, cache.fetched


def readable_facts(reader: Reader, digest: str, tags: TagSet,
                   digests: dict[str, str]) -> dict[str, Any]:
    """image_facts, or `{"unreadable": reason}` for an image whose manifest, config or labels
    are off the schema (one such image must not stop the catalog)."""
    try:
        facts = image_facts(reader, digest, tags, digests)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"unreadable": f"{type(exc).__name__}: {exc}"}
    problem = catalog_unreadable.problem(facts)
    return {"unreadable": problem} if problem else facts


def image_facts(reader: Reader, digest: str, tags: TagSet,
                digests: dict[str, str]) -> dict[str, Any]:
    top = reader.manifest(digest)
    children = top.get("children") or [{"digest": digest, "platform": top.get("platform")}]
    platforms = [platform_facts(reader, c["digest"], tags, digests) for c in children]
    first = platforms[0] if platforms else {}
    return {"digest": digest, "index": "children" in top,
            **facts_from_labels(first.get("labels") or {}, first),
            "platforms": platforms,
            "signature": signature_status(reader, digest, tags, digests, reader.keys)}


def platform_facts(reader: Reader, digest: str, tags: TagSet,
                   digests: dict[str, str]) -> dict[str, Any]:
    facts = reader.manifest(digest)
    groups = layer_groups(facts["history"], len(facts["layers"]))
    layers = [{**layer, "group": group, "uncompressed": reader.uncompressed(layer)}
              for layer, group in zip(facts["layers"], groups, strict=True)]
    unknown = any(layer["uncompressed"] is None for layer in layers)
    found = {kind: evidence(reader, digest, kind, tags, digests) for kind in EVIDENCE_KINDS}
    return {"digest": digest, "platform": facts["platform"], "labels": facts["labels"],
            "created": facts["created"], "config": facts["config"], "audit": audit_state(found),
            "size": sum(layer["size"] for layer in layers) + facts["config_size"],
            "uncompressed_size": None if unknown else sum(la["uncompressed"] for la in layers),
            "layers": [{"digest": la["digest"], "size": la["size"], "group": la["group"],
                        "uncompressed": la["uncompressed"]} for la in layers],
            "evidence": found}


def evidence(reader: Reader, subject: str, kind: str, tags: TagSet,
             digests: dict[str, str]) -> dict[str, Any]:
    tag = tags.artifacts.get((subject, kind))
    if tag is None or tag not in digests:
        return {"present": False}
    summary = reader.artifact(tag, digests[tag], kind, subject)
    if kind in ATTACHED_ONCE:
        reader.cache.data["attached"][f"{subject}|{kind}"] = digests[tag]
    if summary.get("present") and kind in DOWNLOADS:
        return {**summary, "href": download_href(subject, kind)}
    return summary
