"""Turn collected image facts into a CycloneDX 1.6 JSON document (a dict; validated when written).

The document is built as plain JSON data, in a stable order (keys as written here, components
and properties sorted), not through cyclonedx-python-lib's object model: that cost more than
reading the image (sorted sets, a dependency search per edge, reflection to serialise).
sbom.validate checks the result against the strict CycloneDX 1.6 schema wherever it is written.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib.metadata import version as dist_version
from typing import Any

from packageurl import PackageURL

from builder import __version__
from builder.core import labels
from sbom import dpkg, iri, pydist
from sbom.collect import ImageFacts, NativeLib

Json = dict[str, Any]
PROP = "torch-images:"  # our own property namespace
SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"
_LABEL_PREFIXES = (labels.PREFIX, labels.OCI)
_SERIAL_NAMESPACE = uuid.UUID("6f1c7d0e-3b7a-5d2e-9c41-7f1e0b6a2d11")
_SONAME_RE = re.compile(r"^(?P<stem>.+?)\.so(?:\.(?P<ver>[\d.]+))?$")
_DEBIAN = {"name": "Debian"}
_NVIDIA = {"name": "NVIDIA Corporation"}
_DECLARED = "declared"


def build_document(facts: ImageFacts, *, reproducible: bool = False) -> Json:
    """The CycloneDX 1.6 JSON document for `facts` (sbom.validate checks it when written)."""
    image = image_component(facts)
    debs, deb_graph = deb_components(facts)
    dists, dist_graph = python_components(facts)
    top = [c for c in (os_component(facts), base_image_component(facts.labels)) if c]
    top = _sorted_components(top + debs + dists)
    graph = {image["bom-ref"]: [c["bom-ref"] for c in top]} | {c["bom-ref"]: [] for c in top}
    graph |= deb_graph | dist_graph
    vendor = {"name": facts.labels.get(labels.OCI + "vendor") or "torch-images"}
    return {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": _serial(facts, reproducible).urn,
        "version": 1,
        "metadata": {
            "timestamp": _timestamp(facts, reproducible).isoformat(),
            "lifecycles": [{"phase": "post-build"}],
            "tools": {"components": [tool_component(), _cyclonedx_lib()]},
            "authors": [{"name": "torch-images builder"}],
            "component": image,
            "manufacturer": vendor,
            "supplier": vendor,
            "properties": _props([("collector", facts.contents.collector or "docker-export")]),
        },
        "components": top,
        "dependencies": [_dependency(ref, graph[ref]) for ref in sorted(graph)],
        # Honest completeness: dpkg and Python metadata only, no loose files or static binaries.
        "compositions": [{"aggregate": "incomplete", "assemblies": [image["bom-ref"]]}],
    }


def _dependency(ref: str, depends_on: list[str]) -> Json:
    return {"ref": ref, "dependsOn": sorted(set(depends_on))} if depends_on else {"ref": ref}


def component(kind: str, name: str, bom_ref: str, *, version: str | None = None,
              group: str | None = None, purl: PackageURL | None = None, **fields: Any) -> Json:
    """A component dict: the given fields in schema order, empty ones left out."""
    out: Json = {"type": kind, "bom-ref": bom_ref}
    for key, value in (("supplier", fields.get("supplier")),
                       ("publisher", fields.get("publisher")), ("group", group),
                       ("name", name), ("version", version),
                       ("description", fields.get("description")),
                       ("hashes", fields.get("hashes")), ("licenses", fields.get("licenses")),
                       ("purl", purl.to_string() if purl else None),
                       ("externalReferences", fields.get("external_references")),
                       ("properties", fields.get("properties")),
                       ("components", fields.get("components")),
                       ("evidence", fields.get("evidence"))):
        if value:
            out[key] = value
    return out


def _props(pairs: Iterable[tuple[str, str]], prefix: str = PROP) -> list[Json]:
    return [{"name": prefix + k, "value": v} for k, v in sorted(pairs)]


def _sha256(hexdigest: str) -> list[Json]:
    return [{"alg": "SHA-256", "content": hexdigest}]


def _occurrences(locations: Iterable[str]) -> Json:
    return {"occurrences": [{"location": loc} for loc in sorted(set(locations))]}


def _sorted_components(comps: list[Json]) -> list[Json]:
    return sorted(comps, key=lambda c: (c["type"], c.get("group", ""), c["name"],
                                        c.get("version", ""), c["bom-ref"]))


def tool_component() -> Json:
    return component("application", "torch-images", f"tool:torch-images@{__version__}",
                     version=__version__,
                     description="torch-images builder: SBOM stage (reads the image's filesystem)")


@functools.cache
def _cyclonedx_lib() -> Json:
    """cyclonedx-python-lib, which supplies the schema and license data the document uses."""
    name = "cyclonedx-python-lib"
    version = dist_version(name)
    return component("library", name, f"tool:{name}@{version}", version=version,
                     group="CycloneDX", description="CycloneDX schema and SPDX license data")


def _serial(facts: ImageFacts, reproducible: bool) -> uuid.UUID:
    if reproducible or os.environ.get("SOURCE_DATE_EPOCH"):
        return uuid.uuid5(_SERIAL_NAMESPACE, facts.image_id)
    return uuid.uuid4()


def _timestamp(facts: ImageFacts, reproducible: bool) -> datetime:
    """Reproducible: the created label, else SOURCE_DATE_EPOCH, else the image's Created."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not reproducible and not epoch:
        return datetime.now(tz=UTC).replace(microsecond=0)
    created = facts.labels.get(labels.OCI + "created")
    parsed = _parse_time(created) if created else None
    if parsed is None and epoch and epoch.isdigit():
        parsed = datetime.fromtimestamp(int(epoch), tz=UTC)
    return parsed or _parse_time(facts.created) or datetime(1970, 1, 1, tzinfo=UTC)


def _parse_time(value: str) -> datetime | None:
    # Docker writes nanoseconds; fromisoformat takes at most microseconds.
    value = re.sub(r"(\.\d{6})\d+", r"\1", value.strip()).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


def _split_ref(ref: str) -> tuple[str, str]:
    """`repo:tag` → (repo, tag); a digest reference keeps its digest as the version."""
    if "@" in ref:
        repo, digest = ref.split("@", 1)
        return repo, digest
    head, sep, tag = ref.rpartition(":")
    if sep and "/" not in tag:
        return head, tag
    return ref, "latest"


def _oci_purl(repo: str, digest: str, tag: str | None) -> PackageURL:
    """pkg:oci/<name>@sha256:…?repository_url=<registry/path>&tag=<tag>."""
    qualifiers = {"repository_url": repo}
    if tag:
        qualifiers["tag"] = tag
    return PackageURL(type="oci", name=repo.rsplit("/", 1)[-1].lower(), version=digest,
                      qualifiers=qualifiers)


def image_component(facts: ImageFacts) -> Json:
    ref = facts.ref
    if ref.startswith("sha256:") or re.fullmatch(r"[0-9a-f]{12,64}", ref):
        ref = facts.repo_tags[0] if facts.repo_tags else f"image:{facts.image_id[7:19]}"
    name, tag = _split_ref(ref)
    props = [("image.id", facts.image_id), ("image.platform", f"{facts.os}/{facts.architecture}")]
    props += [("image.repo-digest", d) for d in facts.repo_digests]
    label_props = _props(((k, v) for k, v in facts.labels.items()
                          if k.startswith(_LABEL_PREFIXES)), prefix="")
    digest = next((d.split("@", 1)[1] for d in facts.repo_digests if "@" in d), None)
    purl = _oci_purl(name, digest, tag) if digest else None
    return component(
        "container", name, purl.to_string() if purl else f"image:{name}@{facts.image_id}",
        version=tag, purl=purl, hashes=_sha256(facts.image_id.split(":")[-1]),
        properties=label_props + _props(props),
    )


def base_image_component(image_labels: dict[str, str]) -> Json | None:
    """The base image named by the OCI base.* labels, when the build recorded them."""
    base = image_labels.get(labels.OCI + "base.name")
    if not base:
        return None
    digest = image_labels.get(labels.OCI + "base.digest", "")
    name, tag = _split_ref(base)
    purl = _oci_purl(name, digest, tag) if digest.startswith("sha256:") else None
    return component(
        "container", name, purl.to_string() if purl else f"base-image:{base}",
        version=digest or tag, purl=purl, hashes=_sha256(digest[7:]) if purl else None,
        properties=_props([("role", "base-image")]),
    )


def os_component(facts: ImageFacts) -> Json | None:
    osr = facts.contents.os_release
    if not osr.get("ID"):
        return None
    version = osr.get("VERSION_ID", "")
    return component("operating-system", osr["ID"], f"os:{osr['ID']}@{version}",
                     version=version or None, description=osr.get("PRETTY_NAME") or None,
                     supplier=_DEBIAN if osr["ID"] == "debian" else None)


def _licenses(values: Iterable[str]) -> list[Json]:
    """SPDX ids where valid, else names; a lone value may be an SPDX expression."""
    values = [v for v in dict.fromkeys(values) if v]
    if len(values) == 1 and _spdx_id(values[0]) is None and _is_spdx_expression(values[0]):
        return [{"expression": values[0], "acknowledgement": _DECLARED}]
    out = []
    for value in values:
        spdx_id = _spdx_id(value)
        key = ("id", spdx_id) if spdx_id else ("name", value)
        out.append({"license": {key[0]: key[1], "acknowledgement": _DECLARED}})
    return out


@functools.cache
def _spdx_ids() -> dict[str, str]:
    """Lower-cased SPDX license id → its spelling, from the schema the document must meet."""
    import json

    from cyclonedx.schema._res import SPDX_JSON

    with open(SPDX_JSON, encoding="utf-8") as f:
        return {i.lower(): i for i in json.load(f)["enum"]}


def _spdx_id(value: str) -> str | None:
    return _spdx_ids().get(value.lower())


@functools.cache
def _is_spdx_expression(value: str) -> bool:
    from cyclonedx.spdx import is_expression  # slow import (builds the SPDX licensing)

    return bool(is_expression(value))


def deb_components(facts: ImageFacts) -> tuple[list[Json], dict[str, list[str]]]:
    """dpkg packages as pkg:deb components, and their dependency graph by bom-ref."""
    osr = facts.contents.os_release
    distro_id = osr.get("ID", "debian")
    distro = f"{distro_id}-{osr['VERSION_ID']}" if osr.get("VERSION_ID") else distro_id
    packages = dpkg.parse_status(facts.contents.dpkg_status)
    refs: dict[str, str] = {}
    comps: dict[str, Json] = {}
    for p in packages:
        purl = deb_purl(p, distro_id, distro)
        ref = purl.to_string()
        refs.setdefault(p.name, ref)
        copyright_text = facts.contents.copyrights.get(p.name, "")
        comps[ref] = component(
            "library", p.name, ref, version=p.version, purl=purl,
            supplier=_DEBIAN if distro_id == "debian" else None,
            publisher=p.maintainer or None, description=p.description or None,
            licenses=_licenses(dpkg.copyright_licenses(copyright_text)),
            properties=_props([("package-manager", "dpkg")]),
        )
    graph = {refs[name]: [refs[d] for d in deps] for name, deps in
             dpkg.resolve_depends(packages).items()}
    return list(comps.values()), graph


def deb_purl(p: dpkg.DebPackage, distro_id: str, distro: str) -> PackageURL:
    """Like syft: arch, distro, and upstream=<source>[@<version>] when the source differs."""
    qualifiers = {"arch": p.architecture, "distro": distro}
    if p.source:
        qualifiers["upstream"] = f"{p.source}@{p.source_version}" if p.source_version else p.source
    elif p.source_version:
        qualifiers["upstream"] = f"{p.name}@{p.source_version}"
    return PackageURL(type="deb", namespace=distro_id, name=p.name, version=p.version,
                      qualifiers={k: v for k, v in qualifiers.items() if v})


def pypi_purl(name: str, version: str) -> PackageURL:
    return PackageURL(type="pypi", name=pydist.normalize(name), version=version)


def python_components(facts: ImageFacts) -> tuple[list[Json], dict[str, list[str]]]:
    """Installed distributions as pkg:pypi components with their bundled native libraries."""
    dists = [d for raw in facts.contents.dists if (d := pydist.parse_dist(raw))]
    owners = _lib_owners(dists, facts.contents.native_libs)
    first: dict[str, pydist.Dist] = {}  # bom-ref → the first dist of that release
    places: dict[str, list[str]] = {}  # the same release in two site-packages: two places
    ref_of: dict[tuple[str, str], str] = {}  # (site, key) → bom-ref
    for dist in dists:
        ref = pypi_purl(dist.name, dist.version).to_string()
        ref_of[(dist.site, dist.key)] = ref
        first.setdefault(ref, dist)
        places.setdefault(ref, []).append(dist.dist_info_path)
    libs = _native_lib_components(ref_of, owners, facts.contents.native_libs)
    comps = [_dist_component(dist, places[ref], libs.get(ref, [])) for ref, dist in first.items()]
    comps += libs.get("", [])  # libraries no distribution owns
    graph: dict[str, list[str]] = {}
    for dist in dists:
        parent = ref_of[(dist.site, dist.key)]
        for key in pydist.required_names(dist, facts.architecture):
            child = ref_of.get((dist.site, key)) or next(
                (r for (_, k), r in ref_of.items() if k == key), None)
            if child and child != parent and child not in graph.setdefault(parent, []):
                graph[parent].append(child)
    return comps, graph


def _dist_component(dist: pydist.Dist, locations: list[str], libs: list[Json]) -> Json:
    license_values = ([dist.license_expression] if dist.license_expression
                      else [dist.license] if dist.license else dist.classifier_licenses)
    refs = []
    if dist.home_page.startswith(("http://", "https://")) and iri.is_iri(dist.home_page):
        refs.append({"type": "website", "url": dist.home_page})
    purl = pypi_purl(dist.name, dist.version)
    return component(
        "library", dist.key, purl.to_string(), version=dist.version, purl=purl,
        description=dist.summary or None, publisher=dist.author or None,
        supplier=_NVIDIA if dist.key.startswith("nvidia-") else None,
        licenses=_licenses(license_values), external_references=refs,
        properties=_props([("package-manager", "python"), ("python", dist.python)]),
        components=_sorted_components(libs), evidence=_occurrences(locations),
    )


def _lib_owners(dists: list[pydist.Dist], libs: list[NativeLib]) -> dict[str, pydist.Dist]:
    """In-image library path → owning distribution: from RECORD, else from the directory name."""
    by_file = {f"{d.site}/{path}": d for d in dists for path in d.files}
    owners: dict[str, pydist.Dist] = {}
    for lib in libs:
        owner = by_file.get(lib.path) or _guess_owner(lib, dists)
        if owner is not None:
            owners[lib.path] = owner
    return owners


def _guess_owner(lib: NativeLib, dists: list[pydist.Dist]) -> pydist.Dist | None:
    """nvidia/cudnn/lib → nvidia-cudnn[-cuXX]; torch/lib → torch (same site-packages)."""
    parts = lib.rel.split("/")
    if parts[0] == "torch":
        wanted = re.compile(r"^torch$")
    else:
        wanted = re.compile(rf"^nvidia-{re.escape(parts[1].replace('_', '-'))}(-cu\d+)?$")
    return next((d for d in dists if d.site == lib.site and wanted.match(d.key)), None)


def _native_lib_components(ref_of: dict[tuple[str, str], str], owners: dict[str, pydist.Dist],
                           libs: list[NativeLib]) -> dict[str, list[Json]]:
    """Owner's bom-ref ("" for none) → its bundled libraries' components.

    The same file content under two paths of one owner is one component with two places.
    """
    places: dict[str, list[str]] = {}
    found: dict[str, tuple[str, NativeLib, pydist.Dist | None]] = {}
    for lib in libs:
        owner = owners.get(lib.path)
        ref = native_lib_purl(lib, owner).to_string()
        places.setdefault(ref, []).append(lib.path)
        found.setdefault(ref, (ref_of[(owner.site, owner.key)] if owner else "", lib, owner))
    by_owner: dict[str, list[Json]] = {}
    for ref, (owner_ref, lib, owner) in found.items():
        by_owner.setdefault(owner_ref, []).append(native_lib_component(lib, owner, places[ref]))
    return by_owner


def native_lib_purl(lib: NativeLib, owner: pydist.Dist | None) -> PackageURL:
    """pkg:generic/<nvidia|torch>/<stem>@<wheel or soname version>?checksum=sha256:…

    The checksum qualifier keeps two different files with one name and version apart.
    """
    stem, so_version = _soname(lib)
    version = owner.version if owner else (so_version or None)
    return PackageURL(type="generic", namespace=_lib_namespace(lib), name=stem, version=version,
                      qualifiers={"checksum": f"sha256:{lib.sha256}"})


def _soname(lib: NativeLib) -> tuple[str, str]:
    base = posixpath.basename(lib.path)
    m = _SONAME_RE.match(base)
    return (m["stem"], m["ver"] or "") if m else (base, "")


def _lib_namespace(lib: NativeLib) -> str:
    return "nvidia" if lib.rel.startswith("nvidia/") else lib.rel.split("/", 1)[0]


def native_lib_component(lib: NativeLib, owner: pydist.Dist | None,
                         locations: list[str] | None = None) -> Json:
    stem, so_version = _soname(lib)
    namespace = _lib_namespace(lib)
    purl = native_lib_purl(lib, owner)
    props = [("file.size", str(lib.size))]
    if so_version:
        props.append(("soname-version", so_version))
    if lib.digest_from != "file":
        props.append(("digest-from", lib.digest_from))
    if owner is not None:
        props.append(("bundled-in", pypi_purl(owner.name, owner.version).to_string()))
    return component(
        "library", stem, purl.to_string(), version=purl.version, group=namespace, purl=purl,
        supplier=_NVIDIA if namespace == "nvidia" else None, hashes=_sha256(lib.sha256),
        properties=_props(props), evidence=_occurrences(locations or [lib.path]),
    )
