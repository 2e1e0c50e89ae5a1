"""The catalog's facts, read from the registry alone: `catalog.json` (see its schema).

Input is one vetted repository (`REGISTRY/REPOSITORY`); nothing from a checkout, `.state/` or
the matrix. Its tag list says nearly everything: floating tags, their dated tags
(`<floating>-YYYYMMDD[.n]`), `build-<hash>` tags and the fallback tags of the evidence attached
to each digest (`sha256-<hex>.sbom|smoke|provenance|audit|rebuild`, cosign's `.sig` and
`.att`). Each tag
is resolved to a digest with one HEAD; what a digest names never changes, so every manifest,
config and artifact read is cached by its digest, and a second run fetches only new digests.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import labels, oci, sign, state
from builder.core.errors import BuilderError
from builder.model import publication
from builder.stages import provenance
from builder.stages.catalog_page import key_href, key_name
from sbom.diff import component_counts, diff_sboms
from smoke.host import host_summary

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "catalog.schema.json"
SCHEMA_VERSION = 1
CACHE_VERSION = 4
WORKERS = 8  # parallel registry requests; loopback and remote registries both serve this many

ARTIFACT_TAG = re.compile(r"^sha256-([0-9a-f]{64})\.([a-z]+)$")
DATED_TAG = re.compile(r"^(?P<floating>.+)-(?P<date>\d{8})(?:\.(?P<n>\d+))?$")
BUILD_TAG = re.compile(r"^build-[0-9a-f]+$")
EVIDENCE_KINDS = ("sbom", "smoke", "provenance", "audit", "rebuild")
# What `builder publish` attaches to a digest before any tag points at it and never replaces:
# read once per image digest, so a run with nothing new does not even ask for their tags. An
# audit, a rebuild reason and signatures may be added later: their tags are asked every run.
ATTACHED_ONCE = ("sbom", "smoke", "provenance")
# cosign's annotation of a keyless (Fulcio certificate) signature.
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
# What a page offers for download, by kind (the others are summarised only).
DOWNLOADS = ("sbom", "smoke", "provenance")

# Layer groups, from the `created_by` of each layer in the image config's history (the
# Dockerfile templates' steps); the order is the stack's order.
# Debian packages that give an image a shell (`docker exec … sh` works).
SHELLS = ("dash", "bash", "busybox", "zsh")
GROUPS = ("base", "python", "nvidia", "torch", "packages", "toolchain")
_TOOLCHAIN_MARKS = ("torch-images-compiler", "build-essential", "/usr/local/cuda",
                    "cuda-arch-list", "nvcc")


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
                                                "verified": {}, "attached": {}}
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


# ---- tags -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TagSet:
    images: list[str]  # floating, dated and alias tags
    artifacts: dict[tuple[str, str], str]  # (subject digest, kind) → tag
    builds: list[str]


def classify(tags: Iterable[str]) -> TagSet:
    images, builds, artifacts = [], [], {}
    for tag in tags:
        if match := ARTIFACT_TAG.match(tag):
            artifacts[(f"sha256:{match[1]}", match[2])] = tag
        elif BUILD_TAG.match(tag):
            builds.append(tag)
        else:
            images.append(tag)
    return TagSet(sorted(images), artifacts, sorted(builds))


def dated_key(tag: str) -> tuple[str, str, int] | None:
    """`2.9.1-py3.11-cpu-runtime-20261204.1` → (floating, date, n); None for other tags."""
    match = DATED_TAG.match(tag)
    if not match:
        return None
    return match["floating"], match["date"], int(match["n"] or 0)


# ---- reading one image ------------------------------------------------------------------------


class Reader:
    """Reads manifests, configs and artifacts of one repository through the cache."""

    def __init__(self, source: Source, cache: Cache, site: Path, keys: list[Any]) -> None:
        self.source, self.cache, self.site, self.keys = source, cache, site, keys
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


def download_href(subject: str, kind: str) -> str:
    return f"evidence/{subject.removeprefix('sha256:')}.{kind}.json"


def platform_name(doc: dict[str, Any]) -> str:
    """`linux/amd64`, `linux/arm64` (its `v8` variant is implied, as docker and the matrix
    write it), `linux/arm/v7`."""
    arch, variant = doc.get("architecture", "?"), doc.get("variant")
    implied = arch == "arm64" and variant == "v8"
    return f"{doc.get('os', 'linux')}/{arch}" + (f"/{variant}" if variant and not implied else "")


def run_config(config: dict[str, Any]) -> dict[str, Any]:
    """What `docker run` starts with, from the image config: user, entrypoint, command, working
    folder and environment (the page's specifications)."""
    return {"user": config.get("User") or None, "entrypoint": config.get("Entrypoint") or None,
            "cmd": config.get("Cmd") or None, "workdir": config.get("WorkingDir") or None,
            "env": [str(e) for e in config.get("Env") or []]}


def layer_groups(history: list[str], count: int) -> list[str]:
    """The group of each of `count` layers, from the history of the non-empty layers (an image
    without a history, or with one of another length, is one `base` group)."""
    if len(history) != count:
        return ["base"] * count
    out, group, venv_installs = [], "base", 0
    for created_by in history:
        text = created_by or ""
        if "-m venv" in text:
            group = "python"
        elif group != "toolchain" and any(mark in text for mark in _TOOLCHAIN_MARKS):
            group = "toolchain"
        elif "uv pip install" in text and group != "toolchain":
            if "--target /opt/nvidia" in text:
                group = "nvidia"
            else:
                venv_installs += 1
                group = "torch" if venv_installs == 1 else "packages"
        elif group not in ("base", "toolchain"):
            group = "packages"  # the smoke suite, links and facts file: a few kB
        out.append(group)
    return out


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


def sbom_summary(doc: dict[str, Any]) -> dict[str, Any]:
    counts, found = component_counts(doc)
    components = [{k: comp[k] for k in ("type", "group", "name", "version", "purl")
                   if comp.get(k)} for comp in found]
    shells = sorted(f"{c['name']} {c.get('version', '')}".strip() for c in components
                    if c.get("name") in SHELLS and "pkg:deb/" in c.get("purl", ""))
    props = {p.get("name"): p.get("value") for p in doc.get("properties") or []}
    audited = any(str(k).startswith("torch-images:audit") for k in props)
    return {"spec_version": doc.get("specVersion"), "counts": counts,
            "total": sum(counts.values()), "shells": shells, "components": components,
            "vulnerabilities": len(doc.get("vulnerabilities") or []) if audited else None,
            "timestamp": (doc.get("metadata") or {}).get("timestamp")}


def smoke_summary(doc: dict[str, Any]) -> dict[str, Any]:
    host = doc.get("host") or {}
    used = host.get("cuda_devices")
    gpus = [{"name": g.get("name", "?"), "capability": g.get("capability")}
            for g in (used if used is not None else host.get("gpus")) or []]
    return {"status": doc.get("status"), "require_gpu": bool(doc.get("require_gpu")),
            "finished": doc.get("finished"), "emulated": bool(doc.get("emulated")),
            "host": {"gpus": gpus, "driver": host.get("driver"), "machine": host.get("machine"),
                     "cpu_count": host.get("cpu_count"), "summary": host_summary(host)},
            "checks": [{"name": c.get("name", "?"), "status": c.get("status", "?"),
                        "message": (c.get("message") or "")[:200]}
                       for c in doc.get("checks") or []],
            "arch_list": arch_list(doc.get("checks") or [])}


def arch_list(checks: list[dict[str, Any]]) -> list[str] | None:
    """The torch wheel's CUDA architectures as the smoke suite read them: `env` reads the
    wheel's arch flags (no GPU needed), `cuda` the runtime's list (on a GPU)."""
    metrics = {c.get("name"): c.get("metrics") or {} for c in checks}
    found = ((metrics.get("env") or {}).get("actual") or {}).get("cuda_arch_flags") \
        or (metrics.get("cuda") or {}).get("arch_list")
    return [str(a) for a in found] if isinstance(found, list) and found else None


def provenance_summary(doc: dict[str, Any], subject: str) -> dict[str, Any]:
    predicate = doc.get("predicate") or {}
    definition = predicate.get("buildDefinition") or {}
    params = definition.get("externalParameters") or {}
    roles = provenance.dependencies_by_role(doc)
    lock = (roles.get("lock") or {}).get("digest", {}).get("sha256")
    base = (roles.get("base") or {}).get("digest", {}).get("sha256")
    subjects = [s.get("digest", {}).get("sha256") for s in doc.get("subject") or []]
    return {"commit": params.get("revision") or None, "source": params.get("source") or None,
            "lock_hash": lock, "base_digest": f"sha256:{base}" if base else None,
            "builder": ((predicate.get("runDetails") or {}).get("builder") or {}).get("id"),
            "subject_matches": subject.removeprefix("sha256:") in subjects}


def audit_summary(doc: dict[str, Any]) -> dict[str, Any]:
    sources = {name: (s.get("status") if isinstance(s, dict) else s)
               for name, s in (doc.get("sources") or {}).items()}
    return {"vulnerabilities": len(doc.get("vulnerabilities") or []), "ok": doc.get("ok"),
            "sources": sources, "date": doc.get("audited_at") or doc.get("date"),
            "unknown": len(doc.get("unknown") or []),
            "incomplete": sorted(name for name, status in sources.items() if status != "ok")}


def rebuild_summary(doc: dict[str, Any]) -> dict[str, Any]:
    return {"reasons": [str(r) for r in doc.get("reasons") or []],
            "detail": str(doc.get("detail") or "")[:500]}


def signature_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """A cosign `.sig` or `.att` manifest: how many signatures or attestations (of which
    predicate types) it holds; checking them takes a key (`signature_status`)."""
    notes = [layer.get("annotations") or {} for layer in doc.get("layers") or []]
    return {"count": len(notes), "keyless": any(CERTIFICATE_ANNOTATION in n for n in notes),
            "predicate_types": sorted({n[sign.PREDICATE_ANNOTATION] for n in notes
                                       if n.get(sign.PREDICATE_ANNOTATION)})}


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
    if not keys or not out["present"]:
        return out
    key = "|".join([*(digests.get(tags.artifacts.get((digest, k), ""), "") for k in found),
                    *(sign.key_id(k) for k in keys)])
    return {**out, **reader.cache.get("verified", key, lambda: verify_signed(
        reader, digest, keys))}


def verify_signed(reader: Reader, digest: str, keys: list[Any]) -> dict[str, Any]:
    repo = reader.source.repository
    try:
        detail = sign.verify_image(reader.reg, repo, digest, keys)
    except sign.SignatureError as exc:
        return {"verified": False, "detail": str(exc)}
    attested, _ = sign.verified_attestations(reader.reg, repo, digest, keys)
    if attested:
        detail += f"; verified attestations: {', '.join(sorted(attested))}"
    return {"verified": True, "detail": detail}


# ---- the catalog ------------------------------------------------------------------------------


def collect(source: Source, site: Path, cache_path: Path | None, *, keys: list[Any] | None = None,
            progress: Callable[[str], None] = lambda _: None) -> tuple[dict[str, Any], int]:
    """(the catalog document, how many digests were fetched: 0 when nothing was new). `keys`:
    cosign public keys to verify signatures with (without, their presence is reported)."""
    cache = Cache(cache_path)
    reader = Reader(source, cache, site, keys or [])
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
            lambda d: image_facts(reader, d, tags, digests), set(by_tag.values())), strict=True))
    cache.save()
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "registry": source.registry, "repository": source.repository,
        "tags": dict(sorted(by_tag.items())),
        "images": dict(sorted(images.items())),
        "variants": variants(by_tag, images),
        "public_keys": public_keys(keys or []),
    }
    for image in images.values():  # the changelogs are made: the SBOM itself is downloadable
        for platform in image["platforms"]:
            platform["evidence"]["sbom"].pop("components", None)
    return doc, cache.fetched


def public_keys(keys: list[Any]) -> list[dict[str, str]]:
    """The keys the catalog verified with, as the site offers them for download."""
    names = [key_name(i, len(keys)) for i in range(len(keys))]
    return [{"name": name, "href": key_href(name), "key_id": sign.key_id(key),
             "pem": sign.public_pem(key).decode()} for name, key in zip(names, keys, strict=True)]


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


def facts_from_labels(found: dict[str, str], first: dict[str, Any]) -> dict[str, Any]:
    """The versions a platform team chooses by, from the first platform's labels."""
    get = found.get
    smoke = (first.get("evidence") or {}).get("smoke") or {}
    archs = smoke.get("arch_list") or []
    return {"variant": get(labels.VARIANT), "torch": get(labels.TORCH),
            "python": get(labels.PYTHON), "accelerator": get(labels.ACCELERATOR) or "cpu",
            "cuda": get(labels.CUDA) or None, "cudnn": get(labels.CUDNN) or None,
            "nccl": get(labels.NCCL) or None, "triton": get(labels.TRITON) or None,
            "flavor": get(labels.FLAVOR), "min_driver": get(labels.MIN_DRIVER) or None,
            "cuda_archs": archs, "content_hash": get(labels.CONTENT_HASH),
            "lock_hash": get(labels.LOCK_HASH),
            "revision": get(labels.OCI + "revision"), "source": get(labels.OCI + "source"),
            "base_digest": get(labels.OCI + "base.digest"),
            "created": get(labels.OCI + "created") or first.get("created")}


def variants(by_tag: dict[str, str], images: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per floating tag: its image, aliases, and dated history (oldest first), each
    dated build with the changes from the one before (SBOM diff) and its rebuild reason."""
    dated: dict[str, list[tuple[str, int, str]]] = {}
    for tag in by_tag:
        if key := dated_key(tag):
            dated.setdefault(key[0], []).append((key[1], key[2], tag))
    floating = sorted(set(dated) | {t for t in by_tag if not dated_key(t)})
    out = []
    for date, _, tag in sorted(d for entries in dated.values() for d in entries):
        images[by_tag[tag]].setdefault("published", f"{date[:4]}-{date[4:6]}-{date[6:]}")
    for name in floating:
        if name not in by_tag and name not in dated:
            continue
        history = [history_entry(tag, date, by_tag[tag], images)
                   for date, _, tag in sorted(dated.get(name, []))]
        for before, after in itertools.pairwise(history):
            after["changes"] = changes(images[before["digest"]], images[after["digest"]])
        digest = by_tag.get(name) or (history[-1]["digest"] if history else None)
        aliases = sorted(t for t, d in by_tag.items()
                         if d == digest and t != name and not dated_key(t) and t not in dated)
        out.append({"tag": name, "digest": digest, "floating": name in by_tag,
                    "aliases": aliases, "history": history})
    return out


def history_entry(tag: str, date: str, digest: str,
                  images: dict[str, dict[str, Any]]) -> dict[str, Any]:
    image = images[digest]
    first = image["platforms"][0] if image["platforms"] else {}
    ev = first.get("evidence") or {}
    rebuild = ev.get("rebuild") or {}
    audit = first.get("audit") or audit_state(ev)
    return {"tag": tag, "date": f"{date[:4]}-{date[4:6]}-{date[6:]}", "digest": digest,
            "size": first.get("size"), "vulnerabilities": vulnerabilities(ev),
            "audit": audit["state"],
            "reasons": rebuild.get("reasons") or [], "reason_detail": rebuild.get("detail"),
            "changes": None}


def audit_state(ev: dict[str, Any]) -> dict[str, Any]:
    """The newest audit of one platform: an attached audit report, else one written into the
    SBOM. The latest-audit block, the history chart and table and the index all show this one
    answer, so they agree. `state`: clean, vulnerable, inconclusive (a source could not be
    asked and nothing was found: not a clean bill) or not audited."""
    audit, sbom = ev.get("audit") or {}, ev.get("sbom") or {}
    if audit.get("present") and audit.get("vulnerabilities") is not None:
        found, incomplete = int(audit["vulnerabilities"]), list(audit.get("incomplete") or [])
        state = "vulnerable" if found else "inconclusive" if incomplete else "clean"
        return {"state": state, "vulnerabilities": found, "date": audit.get("date"),
                "from": "audit", "incomplete": incomplete}
    if sbom.get("present") and sbom.get("vulnerabilities") is not None:
        found = int(sbom["vulnerabilities"])
        return {"state": "vulnerable" if found else "clean", "vulnerabilities": found,
                "date": None, "from": "sbom", "incomplete": []}
    return {"state": "not audited", "vulnerabilities": None, "date": None, "from": None,
            "incomplete": []}


def vulnerabilities(ev: dict[str, Any]) -> int | None:
    """The newest audit's count; None when not audited or not conclusive (never a clean 0)."""
    audit = audit_state(ev)
    return None if audit["state"] in ("inconclusive", "not audited") else audit["vulnerabilities"]


def changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Packages added, removed and upgraded between two images' SBOMs (their first platform)."""
    sboms = [((image["platforms"] or [{}])[0].get("evidence") or {}).get("sbom") or {}
             for image in (old, new)]
    if not all(s.get("present") and "components" in s for s in sboms):
        return None
    result = diff_sboms({"components": sboms[0]["components"]},
                        {"components": sboms[1]["components"]})
    return {k: result[k] for k in ("added", "removed", "changed", "unchanged")}


def same_facts(doc: dict[str, Any], previous: Path) -> bool:
    """Whether `previous` (a catalog.json) says the same as `doc`; then `doc` keeps its
    `generated_at`, so an unchanged registry leaves every file of the site unchanged."""
    try:
        old = json.loads(previous.read_text())
    except (OSError, ValueError):
        return False
    if {**old, "generated_at": None} != {**doc, "generated_at": None}:
        return False
    doc["generated_at"] = old["generated_at"]
    return True


# ---- the schema -------------------------------------------------------------------------------


def validate(doc: dict[str, Any]) -> None:
    """Raise when `doc` does not match the shipped JSON Schema (a bug: the code wrote it)."""
    publication.validate(doc, Path("catalog.json"), SCHEMA_PATH)
