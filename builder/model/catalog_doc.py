"""The catalog document's rules, as pure functions of what the registry returned: the tag grammar
(floating, dated, `build-`, attached evidence), the layer groups, the summaries of attached
evidence and each variant's dated history. builder.stages.catalog reads the registry through
them; the site (builder.stages.catalog_site) reads the groups.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import keypair, labels, sign
from builder.model import publication
from builder.model.catalog_page import key_href, key_name
from sbom.diff import component_counts, diff_sboms
from smoke.host import host_summary

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "catalog.schema.json"
SCHEMA_VERSION = 1
# `sha256-<hex>.<kind>`: evidence and signatures; bare `sha256-<hex>`: the referrers index
# (the OCI tag-schema fallback listing sigstore bundles), kind REFERRERS.
ARTIFACT_TAG = re.compile(r"^sha256-([0-9a-f]{64})(?:\.([a-z]+))?$")
REFERRERS = "referrers"
DATED_TAG = re.compile(r"^(?P<floating>.+)-(?P<date>\d{8})(?:\.(?P<n>\d+))?$")
BUILD_TAG = re.compile(r"^build-[0-9a-f]+$")
MAX_FIXES = 200  # "fix available" rows kept per audit (the count is always the whole)
TWIN_SUFFIX = "-zstd"  # builder.stages.twin.SUFFIX (the model does not import stages)
# cosign's annotation of a keyless (Fulcio certificate) signature.
CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
# Debian packages that give an image a shell (`docker exec … sh` works).
SHELLS = ("dash", "bash", "busybox", "zsh")
# Layer groups, from the `created_by` of each layer in the image config's history (the
# Dockerfile templates' steps); the order is the stack's order.
GROUPS = ("base", "python", "nvidia", "torch", "packages", "toolchain")
_TOOLCHAIN_MARKS = ("torch-images-compiler", "build-essential", "/usr/local/cuda",
                    "cuda-arch-list", "nvcc")


# ---- tags ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TagSet:
    images: list[str]  # floating, dated and alias tags
    artifacts: dict[tuple[str, str], str]  # (subject digest, kind) → tag
    builds: list[str]
    twins: list[str] = field(default_factory=list)  # `<tag>-zstd` (builder.stages.twin)


def classify(tags: Iterable[str]) -> TagSet:
    images, builds, artifacts, twins = [], [], {}, []
    for tag in tags:
        if match := ARTIFACT_TAG.match(tag):
            artifacts[(f"sha256:{match[1]}", match[2] or REFERRERS)] = tag
        elif tag.endswith(TWIN_SUFFIX):
            twins.append(tag)
        elif BUILD_TAG.match(tag):
            builds.append(tag)
        else:
            images.append(tag)
    return TagSet(sorted(images), artifacts, sorted(builds), sorted(twins))


def dated_key(tag: str) -> tuple[str, str, int] | None:
    """`2.9.1-py3.11-cpu-runtime-20261204.1` → (floating, date, n); None for other tags."""
    match = DATED_TAG.match(tag)
    if not match:
        return None
    return match["floating"], match["date"], int(match["n"] or 0)


# ---- images and layers -----------------------------------------------------------------------


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


# ---- artifact summaries ----------------------------------------------------------------------


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


def audit_summary(doc: dict[str, Any]) -> dict[str, Any]:
    sources = {name: (s.get("status") if isinstance(s, dict) else s)
               for name, s in (doc.get("sources") or {}).items()}
    vulns = [v for v in doc.get("vulnerabilities") or [] if isinstance(v, dict)]
    return {"vulnerabilities": len(doc.get("vulnerabilities") or []), "ok": doc.get("ok"),
            "sources": sources, "date": doc.get("audited_at") or doc.get("date"),
            "unknown": len(doc.get("unknown") or []),
            "incomplete": sorted(name for name, status in sources.items() if status != "ok"),
            "fixes": [{"id": str(v.get("id") or ""), "package": str(v.get("name") or ""),
                       "version": str(v.get("version") or ""),
                       "fixed": [str(f) for f in v["fix_versions"]],
                       "aliases": [str(a) for a in v.get("aliases") or []]}
                      for v in vulns if v.get("fix_versions")][:MAX_FIXES]}


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


# ---- the catalog's keys, variants and history ------------------------------------------------


def public_keys(keys: list[Any]) -> list[dict[str, str]]:
    """The keys the catalog verified with, as the site offers them for download."""
    names = [key_name(i, len(keys)) for i in range(len(keys))]
    return [{"name": name, "href": key_href(name), "key_id": keypair.key_id(key),
             "pem": keypair.public_pem(key).decode()}
            for name, key in zip(names, keys, strict=True)]


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


def dated_by_floating(by_tag: dict[str, str]) -> dict[str, list[tuple[str, int, str]]]:
    """floating name → its dated tags as (date, n, tag)."""
    dated: dict[str, list[tuple[str, int, str]]] = {}
    for tag in by_tag:
        if key := dated_key(tag):
            dated.setdefault(key[0], []).append((key[1], key[2], tag))
    return dated


def is_floating(tag: str, by_tag: dict[str, str], images: dict[str, dict[str, Any]],
                dated: dict[str, Any]) -> bool:
    """A variant's floating tag: it has dated tags, or its image's variant label names it (a
    first publication whose dated tag is gone). Any other undated tag is an alias or was pushed
    by hand."""
    return tag in dated or images[by_tag[tag]].get("variant") == tag


def variants(by_tag: dict[str, str], images: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per floating tag: its image, aliases, and dated history (oldest first), each
    dated build with the changes from the one before (SBOM diff) and its rebuild reason."""
    dated = dated_by_floating(by_tag)
    floating = sorted(set(dated) | {t for t in by_tag if not dated_key(t)
                                    and is_floating(t, by_tag, images, dated)})
    out = []
    for image in images.values():
        image.setdefault("published", None)
    for date, _, tag in sorted(d for entries in dated.values() for d in entries):
        images[by_tag[tag]]["published"] = images[by_tag[tag]]["published"] \
            or f"{date[:4]}-{date[4:6]}-{date[6:]}"
    for name in floating:
        if name not in by_tag and name not in dated:
            continue
        history = [history_entry(tag, date, by_tag[tag], images)
                   for date, _, tag in sorted(dated.get(name, []))]
        for before, after in itertools.pairwise(history):
            after["changes"] = changes(images[before["digest"]], images[after["digest"]])
        fixes_taken(history, images)
        digest = by_tag.get(name) or (history[-1]["digest"] if history else None)
        aliases = sorted(t for t, d in by_tag.items()
                         if d == digest and t != name and not dated_key(t) and t not in dated)
        out.append({"tag": name, "digest": digest, "floating": name in by_tag,
                    "aliases": aliases, "history": history})
    return out


def other_tags(by_tag: dict[str, str], listed: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Tags that are no variant's floating, dated or alias tag (a hand-pushed `:scratch-test`):
    listed as they are, so one such tag never stops the site."""
    known = {v["tag"] for v in listed} | {a for v in listed for a in v["aliases"]} \
        | {h["tag"] for v in listed for h in v["history"]}
    return [{"tag": tag, "digest": digest} for tag, digest in sorted(by_tag.items())
            if tag not in known]


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
            "changes": None, "fixes": [dict(f) for f in (ev.get("audit") or {}).get("fixes") or []]}


def fixes_taken(history: list[dict[str, Any]], images: dict[str, dict[str, Any]]) -> None:
    """Each "fix available" row of a dated build names the rebuild that took it (issue 41.7):
    the first later dated build of the variant whose SBOM holds the package at a fixed
    version (`taken_in`, its dated tag); None while no later build has it."""
    for n, entry in enumerate(history):
        for fix in entry["fixes"]:
            fix["taken_in"] = next((later["tag"] for later in history[n + 1:] if holds_version(
                images[later["digest"]], fix["package"], fix["fixed"])), None)


def holds_version(image: dict[str, Any], package: str, versions: list[str]) -> bool:
    """Whether the image's SBOM (its first platform's) lists `package` at one of `versions`."""
    sbom = ((image["platforms"] or [{}])[0].get("evidence") or {}).get("sbom") or {}
    return any(c.get("name") == package and c.get("version") in versions
               for c in sbom.get("components") or [])


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


# ---- the schema ------------------------------------------------------------------------------


def validate(doc: dict[str, Any]) -> None:
    """Raise when `doc` does not match the shipped JSON Schema (a bug: the code wrote it)."""
    publication.validate(doc, Path("catalog.json"), SCHEMA_PATH)
