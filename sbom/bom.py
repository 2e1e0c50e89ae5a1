"""Turn collected image facts into a CycloneDX 1.6 document (as a dict; validated when written)."""

from __future__ import annotations

import json
import os
import posixpath
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from cyclonedx.contrib.license.exceptions import InvalidSpdxLicenseException
from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
from cyclonedx.model import Property as Prop
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.component_evidence import ComponentEvidence, Occurrence
from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity
from cyclonedx.model.license import License, LicenseAcknowledgement
from cyclonedx.model.lifecycle import LifecyclePhase, PredefinedLifecycle
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from builder import __version__, labels
from sbom import dpkg, pydist
from sbom.collect import ImageFacts, NativeLib

PROP = "torch-images:"  # our own property namespace
_LABEL_PREFIXES = (labels.PREFIX, labels.OCI)
_SERIAL_NAMESPACE = uuid.UUID("6f1c7d0e-3b7a-5d2e-9c41-7f1e0b6a2d11")
_SONAME_RE = re.compile(r"^(?P<stem>.+?)\.so(?:\.(?P<ver>[\d.]+))?$")
_DEBIAN = OrganizationalEntity(name="Debian")  # no URL: each one costs a slow IRI check
_NVIDIA = OrganizationalEntity(name="NVIDIA Corporation")
_LICENSES = LicenseFactory()


def build_document(facts: ImageFacts, *, reproducible: bool = False) -> dict[str, Any]:
    """The CycloneDX 1.6 JSON document for `facts` (sbom.validate checks it when written)."""
    bom = build_bom(facts, reproducible=reproducible)
    doc = json.loads(JsonV1Dot6(bom).output_as_string())
    root = str(bom.metadata.component.bom_ref) if bom.metadata.component else None
    # Honest completeness: dpkg and Python metadata only, no loose files or static binaries.
    doc["compositions"] = [{"aggregate": "incomplete", "assemblies": [root] if root else []}]
    return doc


def build_bom(facts: ImageFacts, *, reproducible: bool = False) -> Bom:
    image = image_component(facts)
    os_comp = os_component(facts)
    debs, deb_graph = deb_components(facts)
    dists, dist_graph = python_components(facts)
    top = [c for c in (os_comp, base_image_component(facts.labels)) if c] + debs + dists
    bom = Bom(
        components=top,
        metadata=BomMetaData(
            component=image,
            tools=ToolRepository(components=[tool_component(), this_component()]),
            authors=[OrganizationalContact(name="torch-images builder")],
            supplier=_vendor(facts.labels),
            manufacturer=_vendor(facts.labels),
            lifecycles=[PredefinedLifecycle(LifecyclePhase.POST_BUILD)],
            timestamp=_timestamp(facts, reproducible),
            properties=[Prop(name=PROP + "collector",
                             value=facts.contents.collector or "docker-export")],
        ),
        serial_number=_serial(facts, reproducible),
    )
    bom.register_dependency(image, top)
    by_ref = {str(c.bom_ref): c for c in top}
    for parent, children in (deb_graph | dist_graph).items():
        kids = [by_ref[c] for c in children if c in by_ref]
        bom.register_dependency(by_ref[parent], kids)
    return bom


def tool_component() -> Component:
    return Component(
        type=ComponentType.APPLICATION, name="torch-images", version=__version__,
        description="torch-images builder: SBOM stage (reads the image's filesystem)",
        bom_ref=f"tool:torch-images@{__version__}",
    )


def _vendor(image_labels: dict[str, str]) -> OrganizationalEntity:
    return OrganizationalEntity(name=image_labels.get(labels.OCI + "vendor") or "torch-images")


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


def image_component(facts: ImageFacts) -> Component:
    ref = facts.ref
    if ref.startswith("sha256:") or re.fullmatch(r"[0-9a-f]{12,64}", ref):
        ref = facts.repo_tags[0] if facts.repo_tags else f"image:{facts.image_id[7:19]}"
    name, tag = _split_ref(ref)
    props = [Prop(name=PROP + "image.id", value=facts.image_id),
             Prop(name=PROP + "image.platform", value=f"{facts.os}/{facts.architecture}")]
    props += [Prop(name=PROP + "image.repo-digest", value=d) for d in facts.repo_digests]
    props += [Prop(name=k, value=v) for k, v in sorted(facts.labels.items())
              if k.startswith(_LABEL_PREFIXES)]
    digest = next((d.split("@", 1)[1] for d in facts.repo_digests if "@" in d), None)
    purl = _oci_purl(name, digest, tag) if digest else None
    return Component(
        type=ComponentType.CONTAINER, name=name, version=tag,
        bom_ref=purl.to_string() if purl else f"image:{name}@{facts.image_id}",
        purl=purl,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=facts.image_id.split(":")[-1])],
        properties=props,
    )


def base_image_component(image_labels: dict[str, str]) -> Component | None:
    """The base image named by the OCI base.* labels, when the build recorded them."""
    base = image_labels.get(labels.OCI + "base.name")
    if not base:
        return None
    digest = image_labels.get(labels.OCI + "base.digest", "")
    name, tag = _split_ref(base)
    purl = _oci_purl(name, digest, tag) if digest.startswith("sha256:") else None
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=digest[7:])] if purl else []
    return Component(
        type=ComponentType.CONTAINER, name=name, version=digest or tag, purl=purl, hashes=hashes,
        bom_ref=purl.to_string() if purl else f"base-image:{base}",
        properties=[Prop(name=PROP + "role", value="base-image")],
    )


def os_component(facts: ImageFacts) -> Component | None:
    osr = facts.contents.os_release
    if not osr.get("ID"):
        return None
    version = osr.get("VERSION_ID", "")
    return Component(
        type=ComponentType.OPERATING_SYSTEM, name=osr["ID"], version=version or None,
        description=osr.get("PRETTY_NAME") or None, bom_ref=f"os:{osr['ID']}@{version}",
        supplier=_DEBIAN if osr["ID"] == "debian" else None,
    )


def _licenses(values: Iterable[str]) -> list[License]:
    """SPDX ids where valid, else names; a lone value may be an SPDX expression."""
    values = [v for v in dict.fromkeys(values) if v]
    ack = LicenseAcknowledgement.DECLARED
    if len(values) == 1:
        return [_LICENSES.make_from_string(values[0], license_acknowledgement=ack)]
    result = []
    for value in values:
        try:
            result.append(_LICENSES.make_with_id(value, acknowledgement=ack))
        except InvalidSpdxLicenseException:
            result.append(_LICENSES.make_with_name(value, acknowledgement=ack))
    return result


def deb_components(facts: ImageFacts) -> tuple[list[Component], dict[str, list[str]]]:
    """dpkg packages as pkg:deb components, and their dependency graph by bom-ref."""
    osr = facts.contents.os_release
    distro_id = osr.get("ID", "debian")
    distro = f"{distro_id}-{osr['VERSION_ID']}" if osr.get("VERSION_ID") else distro_id
    packages = dpkg.parse_status(facts.contents.dpkg_status)
    refs: dict[str, str] = {}
    comps: dict[str, Component] = {}
    for p in packages:
        purl = deb_purl(p, distro_id, distro)
        ref = purl.to_string()
        refs.setdefault(p.name, ref)
        comps[ref] = Component(
            type=ComponentType.LIBRARY, name=p.name, version=p.version, purl=purl, bom_ref=ref,
            supplier=_DEBIAN if distro_id == "debian" else None,
            publisher=p.maintainer or None, description=p.description or None,
            licenses=_licenses(dpkg.copyright_licenses(facts.contents.copyrights.get(p.name, ""))),
            properties=[Prop(name=PROP + "package-manager", value="dpkg")],
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


def python_components(facts: ImageFacts) -> tuple[list[Component], dict[str, list[str]]]:
    """Installed distributions as pkg:pypi components with their bundled native libraries."""
    dists = [d for raw in facts.contents.dists if (d := pydist.parse_dist(raw))]
    owners = _lib_owners(dists, facts.contents.native_libs)
    comps: dict[str, Component] = {}
    ref_of: dict[tuple[str, str], str] = {}  # (site, key) → bom-ref
    for dist in dists:
        purl = pypi_purl(dist.name, dist.version)
        ref = purl.to_string()
        ref_of[(dist.site, dist.key)] = ref
        occurrence = Occurrence(location=dist.dist_info_path)
        if ref in comps:  # the same release in two site-packages: one component, two places
            comps[ref].evidence.occurrences.add(occurrence)
            continue
        comps[ref] = _dist_component(dist, purl, occurrence)
    _nest_native_libs(comps, ref_of, owners, facts.contents.native_libs)
    graph: dict[str, list[str]] = {}
    for dist in dists:
        parent = ref_of[(dist.site, dist.key)]
        for key in pydist.required_names(dist, facts.architecture):
            child = ref_of.get((dist.site, key)) or next(
                (r for (_, k), r in ref_of.items() if k == key), None)
            if child and child != parent and child not in graph.setdefault(parent, []):
                graph[parent].append(child)
    return list(comps.values()), graph


def _dist_component(dist: pydist.Dist, purl: PackageURL, occurrence: Occurrence) -> Component:
    license_values = ([dist.license_expression] if dist.license_expression
                      else [dist.license] if dist.license else dist.classifier_licenses)
    refs = []
    if dist.home_page.startswith(("http://", "https://")):
        refs.append(ExternalReference(type=ExternalReferenceType.WEBSITE,
                                      url=XsUri(dist.home_page)))
    return Component(
        type=ComponentType.LIBRARY, name=dist.key, version=dist.version, purl=purl,
        bom_ref=purl.to_string(), description=dist.summary or None,
        publisher=dist.author or None,
        supplier=_NVIDIA if dist.key.startswith("nvidia-") else None,
        licenses=_licenses(license_values), external_references=refs,
        evidence=ComponentEvidence(occurrences=[occurrence]),
        properties=[Prop(name=PROP + "package-manager", value="python"),
                    Prop(name=PROP + "python", value=dist.python)],
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


def _nest_native_libs(
    comps: dict[str, Component], ref_of: dict[tuple[str, str], str],
    owners: dict[str, pydist.Dist], libs: list[NativeLib],
) -> None:
    """Each bundled .so becomes a child of its wheel's component (or a top-level one if orphan)."""
    seen: dict[str, Component] = {}
    for lib in libs:
        owner = owners.get(lib.path)
        parent = comps[ref_of[(owner.site, owner.key)]] if owner else None
        comp = native_lib_component(lib, owner)
        ref = str(comp.bom_ref)
        if ref in seen:  # the same file content under two paths: one component, two places
            seen[ref].evidence.occurrences.add(Occurrence(location=lib.path))
            continue
        seen[ref] = comp
        if parent is not None:
            parent.components.add(comp)
        else:
            comps[ref] = comp


def native_lib_component(lib: NativeLib, owner: pydist.Dist | None) -> Component:
    base = posixpath.basename(lib.path)
    m = _SONAME_RE.match(base)
    stem, so_version = (m["stem"], m["ver"] or "") if m else (base, "")
    namespace = "nvidia" if lib.rel.startswith("nvidia/") else lib.rel.split("/", 1)[0]
    version = owner.version if owner else (so_version or None)
    # The checksum qualifier keeps two different files with one name and version apart.
    purl = PackageURL(type="generic", namespace=namespace, name=stem, version=version,
                      qualifiers={"checksum": f"sha256:{lib.sha256}"})
    props = [Prop(name=PROP + "file.size", value=str(lib.size))]
    if lib.digest_from != "file":
        props.append(Prop(name=PROP + "digest-from", value=lib.digest_from))
    if so_version:
        props.append(Prop(name=PROP + "soname-version", value=so_version))
    if owner is not None:
        props.append(Prop(name=PROP + "bundled-in", value=pypi_purl(owner.name, owner.version)
                          .to_string()))
    return Component(
        type=ComponentType.LIBRARY, name=stem, version=version, group=namespace,
        purl=purl, bom_ref=purl.to_string(),
        supplier=_NVIDIA if namespace == "nvidia" else None,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=lib.sha256)],
        evidence=ComponentEvidence(occurrences=[Occurrence(location=lib.path)]),
        properties=props,
    )
