"""The publication record: what `builder publish` vouched for, as frozen dataclasses with one
`to_json`/`from_json` pair. `published.json` (per variant, every publication oldest first),
`verify`, `rebuild` and the catalog all read and write it through this module, so the record
has one shape, checked against `builder/schema/published.schema.json` on every read and write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Self

from builder.core import state
from builder.core.errors import BuilderError
from builder.model import platforms

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "published.schema.json"
MANIFEST = Path("published.json")  # the default record, in the working folder
SCHEMA_VERSION = 1
OPTIONAL = {"optional": True}  # field metadata: left out of the JSON when empty


class Record:
    """A frozen dataclass read from and written to published.json: its JSON object is its
    fields (see `to_json`); records with nested records override `from_json`."""

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**doc)


@dataclass(frozen=True)
class Artifact(Record):
    """Evidence attached to an image digest (SBOM, smoke report, provenance)."""

    tag: str
    digest: str
    media_type: str
    reference: str


@dataclass(frozen=True)
class Signed(Record):
    """Where the publisher's cosign signature and attestations of the digest are, and by which
    key (sha256 of its DER public key, 12 hex digits)."""

    tag: str
    attestations: str
    key: str


@dataclass(frozen=True)
class ZstdTwin(Record):
    """The publication's `<tag>-zstd` twin (builder.stages.twin): the same config and diff ids,
    tar+zstd layers, for runtimes that unpack zstd (containerd ≥ 1.5, Docker ≥ 23, CRI-O)."""

    digest: str
    reference: str
    tags: tuple[str, ...]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(doc["digest"], doc["reference"], tuple(doc["tags"]))


@dataclass(frozen=True, kw_only=True)
class PlatformEntry(Record):
    """One platform manifest of a multi-platform publication (its index is the record's digest)."""

    platform: str
    digest: str
    sbom: Artifact
    smoke_report: Artifact
    smoke_emulated: bool = False
    reference: str | None = field(default=None, metadata=OPTIONAL)
    image_id: str | None = field(default=None, metadata=OPTIONAL)
    content_hash: str | None = field(default=None, metadata=OPTIONAL)
    hash_tag: str | None = field(default=None, metadata=OPTIONAL)
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    min_driver: str | None = None
    provenance: Artifact | None = field(default=None, metadata=OPTIONAL)
    smoke_gpu: bool = False
    allow_cpu_smoke: bool = False

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PlatformEntry:
        return cls(**artifacts_of(doc))


@dataclass(frozen=True, kw_only=True)
class Publication(Record):
    """One publication of a variant: the digest (a manifest, or the index of `platforms`), its
    tags, the versions in it and the evidence attached to it."""

    date: str
    published_at: str
    registry: str
    repository: str
    digest: str
    reference: str
    image_id: str
    content_hash: str
    tags: tuple[str, ...]
    dated_tag: str
    hash_tag: str
    floating_tag: str
    aliases: tuple[str, ...]
    torch: str | None
    python: str | None
    accelerator: str
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    min_driver: str | None
    flavor: str
    sbom: Artifact
    smoke_report: Artifact
    provenance: Artifact | None = field(default=None, metadata=OPTIONAL)
    smoke_gpu: bool = False
    allow_cpu_smoke: bool = False
    signed: bool = False  # the digest carries the publisher's .sig and .att
    unsigned: bool = False  # --unsigned: staged evidence was not required to be signed
    signature: Signed | None = field(default=None, metadata=OPTIONAL)
    platforms: tuple[PlatformEntry, ...] = field(default=(), metadata=OPTIONAL)
    zstd: ZstdTwin | None = field(default=None, metadata=OPTIONAL)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Publication:
        values = artifacts_of(doc)
        values["tags"], values["aliases"] = tuple(doc["tags"]), tuple(doc["aliases"])
        values["platforms"] = tuple(PlatformEntry.from_json(p) for p in doc.get("platforms", ()))
        values["zstd"] = ZstdTwin.from_json(doc["zstd"]) if doc.get("zstd") else None
        return cls(**values)

    def for_platform(self, name: str) -> Publication | None:
        """This publication as seen by one platform: a multi-platform record's entry for it over
        the variant's fields; a plain record is linux/amd64's."""
        if not self.platforms:
            return self if name == platforms.DEFAULT else None
        mine = [p for p in self.platforms if p.platform == name]
        if not mine:
            return None
        own = {f.name: getattr(mine[0], f.name) for f in fields(PlatformEntry)
               if f.name in PUBLICATION_FIELDS and getattr(mine[0], f.name) is not None}
        return replace(self, **own)


PUBLICATION_FIELDS = {f.name for f in fields(Publication)}


def to_json(obj: Any) -> dict[str, Any]:
    """A record as its JSON object: fields in declaration order, optional ones only when set."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("optional") and value in (None, ()):
            continue
        out[f.name] = plain(value)
    return out


def plain(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def artifacts_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The record's fields with its evidence references as Artifacts."""
    values = {k: Artifact.from_json(v) if k in ("sbom", "smoke_report", "provenance") and v
              else v for k, v in doc.items()}
    if values.get("signature"):
        values["signature"] = Signed.from_json(values["signature"])
    return values


# ---- published.json ---------------------------------------------------------------------------


def load(path: Path) -> dict[str, list[Publication]]:
    """variant id → its publications, oldest first (an absent file is an empty record)."""
    doc = load_document(path)
    return {vid: [Publication.from_json(p) for p in entry["publications"]]
            for vid, entry in doc["variants"].items()}


def latest(path: Path) -> dict[str, Publication]:
    """variant id → its latest publication."""
    return {vid: pubs[-1] for vid, pubs in load(path).items() if pubs}


def load_document(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise BuilderError(f"{path} is a folder, not a publication record",
                           hint="pass --manifest FILE")
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "variants": {}}
    try:
        doc = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:
        why = exc if isinstance(exc, ValueError) else "nested too deep"
        raise BuilderError(f"{path} is not JSON: {why}", hint="restore it from git") from None
    except OSError as exc:
        raise BuilderError(f"cannot read {path}: {exc.strerror or exc}",
                           hint="--manifest names the publication record, a JSON file") from None
    validate(doc, path)
    return doc


def check(path: Path) -> None:
    """Read and validate the record and check that it can be written, before the first push: a
    record that cannot be written after the tags moved would be lost."""
    load_document(path)
    folder = next(p for p in path.absolute().parents if p.exists())
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise BuilderError(f"cannot write {path}: {folder} is not a writable folder",
                           hint="--manifest names where the publication record is kept")


def validate(doc: Any, path: Path, schema_path: Path = SCHEMA_PATH) -> None:
    """Raise naming `path` and the first place where `doc` does not match the schema (the
    publication record's, or another document's such as catalog.json)."""
    import jsonschema  # slow import; only when validating

    schema = json.loads(schema_path.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
    if errors:
        where = "/".join(str(x) for x in errors[0].absolute_path)
        raise BuilderError(f"{path}: {where}: {errors[0].message}",
                           hint=f"schema: {schema_path}")


def record(path: Path, publications: Mapping[str, Publication]) -> None:
    """Append publications to each variant's history (a repeat of the last one is not added)."""
    if not publications:
        return
    doc = load_document(path)
    for vid, pub in publications.items():
        history = doc["variants"].setdefault(vid, {"publications": []})["publications"]
        last = history[-1] if history else {}
        if (last.get("digest"), last.get("dated_tag"), last.get("registry")) != (
                pub.digest, pub.dated_tag, pub.registry):
            history.append(pub.to_json())
    doc["variants"] = dict(sorted(doc["variants"].items()))
    validate(doc, path)
    state.atomic_write(path, json.dumps(doc, indent=2) + "\n")
