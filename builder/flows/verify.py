"""`builder verify REF@sha256:…`: what a platform team checks before it runs an image.

Needs no checkout and no matrix: everything is read from the registry, by digest — the image's
labels, and the smoke report, SBOM and provenance attached to that digest — and checked against
each other. Exit 0 only when everything a platform team needs is there and agrees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from builder.core import keyless, labels, oci, sign, vouch, zstd
from builder.core.errors import BuilderError
from builder.core.oci import RegistryError
from builder.flows import verify_keyless, verify_tags
from builder.model import accelerators, platforms, smokereport
from builder.stages import provenance, twin
from smoke import OK_STATUSES
from smoke.checks import gpu_checks_not_run
from smoke.host import host_summary

OK, MISSING, BAD = "ok", "missing", "fail"
UNSIGNED = "unsigned"  # no key given: the signature was not checked
CPU_ONLY = "cpu-stand-in"  # a CUDA image whose GPU checks ran as CPU stand-ins
PASSING = frozenset({OK, UNSIGNED, CPU_ONLY})  # --require-gpu turns CPU_ONLY into BAD
# Report facts that must equal the image's labels.
AGREEING_FACTS = {"torch": labels.TORCH, "cuda": labels.CUDA, "cudnn": labels.CUDNN,
                  "accelerator": labels.ACCELERATOR, "flavor": labels.FLAVOR}


@dataclass(frozen=True)
class Row:
    what: str
    status: str  # ok | missing | fail
    detail: str


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    ref: str  # a digest or a tag

    @classmethod
    def parse(cls, text: str) -> Reference:
        name, sep, digest = text.partition("@")
        if not sep:
            name, digest = text.rsplit(":", 1) if ":" in text.split("/")[-1] else (text, "")
        registry, _, repository = name.partition("/")
        if not (registry and repository and digest):
            raise BuilderError(f"`{text}` is not REGISTRY/REPOSITORY@sha256:DIGEST",
                               hint="e.g. 127.0.0.1:5000/torch@sha256:… (the `reference` "
                               "field of published.json)")
        return cls(registry, repository, digest)


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What a verifier demands: signatures by these keys and/or sigstore bundles by these
    identities (either is enough unless require_all; neither: refused unless contents_only,
    then the contents alone are checked), GPU smoke."""

    keys: tuple[Any, ...] = ()
    require_gpu: bool = False
    contents_only: bool = False
    by_identity: keyless.KeylessPolicy = field(default_factory=keyless.KeylessPolicy)
    require_all: bool = False

    @property
    def signed(self) -> bool:
        return bool(self.keys or self.by_identity.identities)


def verify(reference: Reference, policy: Policy = Policy()) -> tuple[str, list[Row]]:
    """(the image digest, one row per thing checked): its signature, then each attestation's
    signature and subject, then the contents (taken from the signed attestations when keys are
    given; a file attached beside them must be the same document), then the tag it was asked
    by (flows.verify_tags), for a manifest and an index alike."""
    reg = oci.Registry(reference.registry)
    found = reg.manifest(reference.repository, reference.ref)
    if found is None:
        raise BuilderError(f"`{reference.registry}/{reference.repository}` has no image "
                           f"`{reference.ref}`")
    body, desc = found  # the registry client checked the bytes against a digest ref
    manifest = json.loads(body)
    by_identity = verify_keyless.statements(reg, reference.repository, desc.digest,
                                            policy.by_identity) if policy.signed else None
    row, payloads = signature_row(reg, reference.repository, desc.digest, policy, by_identity)
    rows = [row]
    if desc.media_type in (oci.OCI_INDEX, oci.DOCKER_LIST):
        rows += index_rows(reference, manifest, policy)
        found_labels = [_labels(reg, reference.repository, child["digest"])
                        for child in manifest.get("manifests", [])
                        if child.get("mediaType") not in oci.INDEX_TYPES]
    else:
        config_digest = (manifest.get("config") or {}).get("digest", "")
        config = reg.config(reference.repository, config_digest) if config_digest else {}
        image_labels = (config.get("config") or {}).get("Labels") or {}
        docs, attestation_rows = evidence(reg, reference.repository, desc.digest, policy,
                                          by_identity)
        rows += [*attestation_rows, label_row(image_labels),
                 *smoke_rows(docs["smoke"], config_digest, image_labels, policy),
                 sbom_row(docs["sbom"]),
                 provenance_row(docs["provenance"], desc.digest, image_labels)]
        if (twin_found := twin_row(reg, reference.repository, manifest)) is not None:
            rows.append(twin_found)
        found_labels = [image_labels]
    if not reference.ref.startswith("sha256:"):  # right after the signature: what TAG is
        rows[1:1] = [Row(what, OK if ok else BAD, detail) for what, ok, detail in
                     verify_tags.findings(reg, reference.repository, reference.ref, desc.digest,
                                          found_labels, payloads, policy.keys)]
    return desc.digest, rows


def _labels(reg: oci.Registry, repository: str, digest: str) -> dict[str, str]:
    """The labels of one platform manifest of an index ({} when it has none)."""
    found = reg.manifest(repository, digest)
    if found is None:
        return {}
    config_digest = (json.loads(found[0]).get("config") or {}).get("digest", "")
    config = reg.config(repository, config_digest) if config_digest else {}
    return (config.get("config") or {}).get("Labels") or {}


NOT_CHECKED = ("signature not checked: give --key cosign.pub (the pipeline's public key) or "
               "--certificate-identity … --certificate-oidc-issuer … (its workflow), or "
               "--contents-only to check the contents alone")


def twin_row(reg: oci.Registry, repository: str, manifest: dict[str, Any]) -> Row | None:
    """A zstd twin (builder.stages.twin) must be its gzip sibling's image: the same config
    (so the same diff ids) and as many layers, all tar+zstd."""
    source = (manifest.get("annotations") or {}).get(twin.SOURCE_ANNOTATION)
    if source is None:
        return None
    found = reg.manifest(repository, oci.check_digest(source, "the twin's source annotation"))
    if found is None:
        return Row("zstd twin", BAD, f"its gzip sibling {source[:19]} is not in the repository")
    sibling = json.loads(found[0])
    same = ((sibling.get("config") or {}).get("digest") == (manifest.get("config") or {})
            .get("digest") and len(sibling.get("layers") or []) == len(manifest["layers"]))
    zstd_only = {x.get("mediaType") for x in manifest["layers"]} == {zstd.MEDIA_TYPE}
    if not (same and zstd_only):
        return Row("zstd twin", BAD, f"not the image of its gzip sibling {source[:19]} "
                   "(config or layers differ)")
    if problem := twin_layer_problem(reg, repository, manifest):
        return Row("zstd twin", BAD, problem)
    return Row("zstd twin", OK, f"tar+zstd layers of {source[:19]}'s image, same config, "
               "each layer's uncompressed bytes its diff id")


def twin_layer_problem(reg: oci.Registry, repository: str, manifest: dict[str, Any]) -> str:
    """The first twin layer whose uncompressed bytes do not hash to the config's diff id (the
    same config as the gzip sibling's says nothing about the layers): '' when none."""
    config = reg.config(repository, manifest["config"]["digest"])
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(manifest["layers"]):
        return f"{len(manifest['layers'])} layers, {len(diff_ids)} diff ids in the config"
    for n, (layer, diff_id) in enumerate(zip(manifest["layers"], diff_ids, strict=True), 1):
        where = f"layer {n} ({layer['digest'][:19]})"
        try:
            got = zstd.zstd_diff_id(reg.stream_blob(repository, layer["digest"], layer["size"]),
                                    zstd.inflate_limit(layer["size"]), where)
        except RegistryError as exc:  # LayerMismatch included
            return str(exc)
        if got != diff_id:
            return f"{where} decompresses to {got[:19]}, not the config's diff id {diff_id[:19]}"
    return ""


def signature_row(reg: oci.Registry, repository: str, digest: str, policy: Policy,
                  by_identity: verify_keyless.Statements | None = None
                  ) -> tuple[Row, list[dict[str, Any]] | None]:
    """The signature's row, and the verified payloads (None without keys: not checked);
    `by_identity`: the digest's bundles the trusted identities verified."""
    if not policy.signed:
        if not policy.contents_only:
            return Row("signature", BAD, NOT_CHECKED), None
        has = reg.head(repository, sign.sig_tag(digest)) is not None
        return Row("signature", UNSIGNED, "unsigned: contents only — " + (
            "a signature is attached but was not checked (give --key cosign.pub)" if has
            else "the image carries no signature")), None
    found: list[verify_keyless.Found] = []
    payloads: list[dict[str, Any]] | None = None
    if policy.keys:
        try:
            payloads = sign.verified_payloads(reg, repository, digest, list(policy.keys))
            found.append((payloads, sign.signature_line(digest, list(policy.keys))))
        except sign.SignatureError as exc:
            payloads = []
            found.append((None, str(exc)))
    if by_identity is not None:
        found.append(verify_keyless.image_signature(by_identity, digest))
        # the tags an identity's image bundle names count as those a key's `.sig` names
        payloads = (payloads or []) + vouch.identity_payloads(reg, repository, digest,
                                                              policy.by_identity)[0]
    verified, detail = verify_keyless.pick(found, policy.require_all)
    return Row("signature", BAD if verified is None else OK, detail), payloads


def evidence(reg: oci.Registry, repository: str, digest: str, policy: Policy,
             by_identity: verify_keyless.Statements | None = None
             ) -> tuple[dict[str, Any], list[Row]]:
    """kind → the document to check, and one row per attestation (none without keys)."""
    def fetch(kind: str) -> Any:
        data = reg.fetch_artifact(repository, digest, kind)
        try:
            return None if data is None else json.loads(data)
        except ValueError:
            return "not JSON"

    plain = {kind: fetch(kind) for kind in sign.PREDICATES}
    if not policy.signed:
        return plain, []
    docs: dict[str, Any] = dict.fromkeys(sign.PREDICATES)
    rows = []
    for kind, found in signed_statements(reg, repository, digest, policy,
                                         by_identity).items():
        what = f"attestation {kind}"
        doc, detail = verify_keyless.pick(found, policy.require_all)
        if doc is None:
            rows.append(Row(what, BAD, detail))
            continue
        signed_doc = doc if kind == "provenance" else doc["predicate"]
        attached = plain[kind]
        if attached is not None and sign.predicate_of(kind, attached) != doc["predicate"]:
            rows.append(Row(what, BAD, f"the attached {kind} differs from its signed "
                            "attestation"))
            continue
        docs[kind] = signed_doc
        rows.append(Row(what, OK, detail))
    return docs, rows


def signed_statements(reg: oci.Registry, repository: str, digest: str, policy: Policy,
                      by_identity: verify_keyless.Statements | None
                      ) -> dict[str, list[verify_keyless.Found]]:
    """kind → what the trusted keys and what the trusted identities say of its attestation."""
    found: dict[str, list[verify_keyless.Found]] = {kind: [] for kind in sign.PREDICATES}
    if policy.keys:
        statements, problems = sign.verified_attestations(reg, repository, digest,
                                                          list(policy.keys))
        for kind, ptype in sign.PREDICATES.items():
            found[kind].append((statements[kind], f"{ptype}, DSSE signed, subject "
                                f"{digest[:19]}") if kind in statements
                               else (None, problems[kind]))
    if by_identity is not None:
        for kind, one in verify_keyless.attestations(by_identity, digest).items():
            found[kind].append(one)
    return found


def index_rows(reference: Reference, index: dict[str, Any], policy: Policy) -> list[Row]:
    """A multi-arch index: each platform's manifest is checked (its evidence is attached to
    it, not to the index), rows prefixed with the platform. An index inside an index is
    refused (no recursion: a self-listing index cannot loop)."""
    rows = []
    for child in index.get("manifests", []):  # at most oci.MAX_INDEX_CHILDREN, digests checked
        platform = child.get("platform") if isinstance(child.get("platform"), dict) else {}
        where = f"{platform.get('os', '?')}/{platform.get('architecture', '?')}"
        if child.get("mediaType") in oci.INDEX_TYPES:  # one level: no nesting, so no cycles
            rows.append(Row(f"{where} manifest", BAD, "a nested index: refused"))
            continue
        if where not in platforms.KNOWN:
            rows.append(Row(f"{where} manifest", BAD, "not a platform this pipeline builds "
                            f"({', '.join(platforms.KNOWN)})"))
            continue
        _, child_rows = verify(Reference(reference.registry, reference.repository,
                                         child["digest"]), policy)
        rows += [Row(f"{where} {r.what}", r.status, r.detail) for r in child_rows]
    return rows or [Row("index", MISSING, "the index lists no manifests")]


def label_row(image_labels: dict[str, str]) -> Row:
    wanted = [labels.TORCH, labels.PYTHON, labels.ACCELERATOR, labels.FLAVOR, labels.CONTENT_HASH,
              labels.LOCK_HASH]
    lacking = [key for key in wanted if not image_labels.get(key)]
    if lacking:
        return Row("labels", BAD, f"missing {', '.join(lacking)}")
    versions = ", ".join(f"{key.removeprefix(labels.PREFIX)} {image_labels[key]}"
                         for key in (labels.TORCH, labels.PYTHON, labels.CUDA, labels.CUDNN,
                                     labels.NCCL, labels.MIN_DRIVER) if image_labels.get(key))
    return Row("labels", OK, versions)


def smoke_rows(report: Any, config_digest: str, image_labels: dict[str, str],
               policy: Policy = Policy()) -> list[Row]:
    if report is None:
        return [Row("smoke", MISSING, "no smoke report attached (builder smoke, then publish)")]
    if not isinstance(report, dict) or (problem := smokereport.validation_error(report)):
        return [Row("smoke", BAD, f"the report does not match its schema: {problem}")]
    host = host_summary(report.get("host") or {})
    rows = [Row(f"smoke {c['name']}", OK if c["status"] in OK_STATUSES else BAD,
                f"{c['status']}: {c.get('message', '')}"[:90]) for c in report["checks"]]
    problems = []
    if report["status"] != "pass":
        problems.append(f"overall {report['status']}")
    ran_on = (report.get("image") or {}).get("id")
    if ran_on != config_digest:
        problems.append(f"it ran on image {ran_on}, not this one ({config_digest[:19]})")
    if lacking := smokereport.required_checks_missing(report):
        problems.append(f"it lacks required checks: {', '.join(lacking)}")
    facts = report.get("facts") or {}
    problems += [f"{name} {facts.get(name)!r} ≠ label {image_labels.get(key)!r}"
                 for name, key in AGREEING_FACTS.items()
                 if (facts.get(name) or "") != (image_labels.get(key) or "")]
    if problems:
        return [Row("smoke", BAD, "; ".join(problems)), *rows]
    stand_ins = gpu_checks_not_run(report["checks"])
    if accelerators.needs_gpu_evidence(facts.get("accelerator")) and stand_ins:
        status = BAD if policy.require_gpu else CPU_ONLY
        return [Row("smoke", status, f"GPU checks not run on a GPU ({', '.join(stand_ins)}): "
                    f"{report['status']}: {host}"), *rows]
    return [Row("smoke", OK, f"{report['status']}: {host}"), *rows]


def sbom_row(doc: Any) -> Row:
    import sbom
    from sbom.diff import component_counts, count_line

    if doc is None:
        return Row("sbom", MISSING, "no SBOM attached (builder sbom, then publish)")
    if not isinstance(doc, dict):
        return Row("sbom", BAD, "not a CycloneDX JSON document")
    try:
        sbom.validate(doc)
    except sbom.SbomInvalid as exc:
        return Row("sbom", BAD, f"not valid CycloneDX 1.6: {exc}")
    return Row("sbom", OK, f"CycloneDX {doc.get('specVersion')}: "
               f"{count_line(component_counts(doc)[0])}")


def provenance_row(doc: Any, digest: str, image_labels: dict[str, str]) -> Row:
    if doc is None:
        return Row("provenance", MISSING, "no provenance attached (builder publish attaches it)")
    if problems := provenance.problems(doc, digest, image_labels):
        return Row("provenance", BAD, "; ".join(problems))
    definition = doc["predicate"]["buildDefinition"]
    params = definition["externalParameters"]
    unsigned = (definition.get("internalParameters") or {}).get("unsigned_staging")
    return Row("provenance", OK, f"commit {params.get('revision', '')[:12]}, lock "
               f"{image_labels.get(labels.LOCK_HASH, '')[:12]}, base "
               f"{image_labels.get(labels.OCI + 'base.digest', '')[:19]}"
               + ("; published with --unsigned: its staged evidence was not signed"
                  if unsigned else ""))

