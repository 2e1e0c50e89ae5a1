"""The one staging path, and an image's evidence where every machine can find it.

A built image, its build cache, its base and its evidence go to the registry through `stage`:
every `docker push` through `push` (one retry policy: the registry client's backoff, a failed
push counted as transient), every file through `attach`. Progress and warnings go to stderr
(`output.step`), never to stdout, which stays one JSON document under `--json`. The image must
arrive (its digest is checked); the cache (with a key, its pushed digest signed naming its tag:
builds take it only so) and the base are best effort: a failure is one warning line and the
build goes on.

The registry is the truth between machines: a built image waits in the staging repository
(`<repository>-staging`, tag `build-<hash20>`) and its evidence is attached to its digest there,
so a GPU runner can smoke it, another runner can SBOM it and a third can publish it, each from
an empty checkout. `.state/` (reports and SBOMs by image id) is only a cache of the same files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from builder.core import engine, keypair, media, oci, registry_auth, sign, state, vouch
from builder.core.errors import BuilderError, CommandFailed
from builder.core.keypair import Vouchers
from builder.core.output import step
from builder.model.matrix import Matrix
from builder.model.staged import Staged

PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def find_staged(matrix: Matrix, hash_tag: str) -> Staged | None:
    """The staged image of this content hash, if any machine staged it."""
    reg = oci.Registry(matrix.staging_registry)
    return staged_at(reg, matrix.staging_repository, hash_tag)


def staged_at(reg: oci.Registry, repository: str, ref: str) -> Staged | None:
    found = reg.manifest(repository, ref)
    if found is None:
        return None
    body, desc = found
    config = (json.loads(body).get("config") or {}).get("digest", "")
    return Staged(reg.registry, repository, desc, config)


def fetch(staged: Staged, kind: str) -> bytes | None:
    """The evidence attached to the staged digest, else this machine's cached copy."""
    reg = oci.Registry(staged.registry)
    data = reg.fetch_artifact(staged.repository, staged.digest, kind, media.KINDS[kind].media_type)
    if data is None:
        path = state.evidence_path(kind, staged.image_id)
        data = path.read_bytes() if path.is_file() else None
    return data


def attach(staged: Staged, kind: str, data: bytes,
           key: keypair.SigningKey | None = None) -> dict[str, str]:
    """Attach `data` to the staged digest as `kind` (its media type and file name:
    media.KINDS; idempotent: the same bytes give the same digest) and, with a key, its signed
    attestation (cosign's `.att`) whose subject is that digest."""
    reg = oci.Registry(staged.registry)
    media_type = media.KINDS[kind].media_type
    desc = reg.push_artifact(staged.repository, staged.descriptor, media_type, data, kind=kind,
                             title=media.KINDS[kind].title)
    if key is not None:
        sign.attest(reg, staged.repository, staged.digest, key, kind, predicate(kind, data))
    return {"tag": oci.artifact_tag(staged.digest, kind), "digest": desc.digest,
            "media_type": media_type,
            "reference": f"{staged.registry}/{staged.repository}@{desc.digest}"}


def predicate(kind: str, data: bytes) -> Any:
    """What the attestation of an attached file states: the document itself (a provenance
    file is a whole in-toto statement already: its predicate; an audit report, cosign's vuln
    predicate around it)."""
    doc = json.loads(data)
    if kind == "audit":
        return vuln_predicate(doc)
    return doc["predicate"] if kind == "provenance" else doc


SCANNER = "https://github.com/torch-images/torch-images/sbom/audit"


def vuln_predicate(found: dict[str, Any]) -> dict[str, Any]:
    """cosign's vuln/v1 predicate of a report: the report is the scanner's result."""
    return {"invocation": {"parameters": None, "uri": "", "event_id": "", "builder.id": ""},
            "scanner": {"uri": SCANNER, "version": "1",
                        "db": {"uri": "", "version": ""}, "result": found},
            "metadata": {"scanStartedOn": found.get("audited_at", ""),
                         "scanFinishedOn": found.get("audited_at", "")}}


def signed(staged: Staged, vouchers: Vouchers) -> tuple[dict[str, bytes], dict[str, str]]:
    """The evidence whose attestation on the staged digest a voucher made (a trusted key's or
    identity's: builder.core.vouch), as files (kind → bytes), and kind → why not for the
    rest."""
    found, problems = vouch.attestations(oci.Registry(staged.registry), staged.repository,
                                         staged.digest, vouchers)
    return {kind: as_file(doc.get("predicate")) for kind, doc in found.items()}, problems


def as_file(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def image_config(staged: Staged) -> dict:
    """The image's config, read from its blob in the registry (no engine needed)."""
    return oci.Registry(staged.registry).config(staged.repository, staged.image_id)


def image_labels(staged: Staged) -> dict[str, str]:
    """The image's labels, read from its config blob in the registry (no engine needed)."""
    return oci.Registry(staged.registry).labels(staged.repository, staged.image_id)


def from_reference(text: str) -> Staged | None:
    """`REGISTRY/REPOSITORY@sha256:…` as a staged image; None for a local name or image id."""
    name, sep, digest = text.partition("@")
    registry, _, repository = name.partition("/")
    if not (sep and digest.startswith("sha256:") and repository):
        return None
    staged = staged_at(oci.Registry(registry), repository, digest)
    if staged is None:
        raise oci.RegistryError(f"`{registry}/{repository}` has no image {digest}")
    return staged


def pull(staged: Staged) -> str:
    """Make the staged image present in the local engine; returns its local reference."""
    if engine.inspect_image(staged.image_id) is None:
        with registry_auth.docker_env(staged.registry) as env:
            oci.retry(f"pulling `{staged.reference}`", staged.registry,
                      lambda: engine.docker("pull", "-q", staged.reference, timeout=3600,
                                            env=env), (CommandFailed,))
    return staged.image_id


def record(staged: Staged | None, kind: str, data: bytes,
           key: keypair.SigningKey | None = None) -> None:
    """Keep `data` in this machine's cache and, for a staged image, attach it in the registry
    (signed with `key`, when given)."""
    if staged is None:
        return
    state.atomic_write(state.evidence_path(kind, staged.image_id), data)
    attach(staged, kind, data, key=key)


# ---- the staging path ------------------------------------------------------------------------


def push(local: str, ref: str, *, untag: bool = True, timeout: float = 3600) -> str:
    """`docker push` the local image `local` as `ref` (tagged for the push, the tag removed
    after it unless `untag` is false), retried like every registry call; returns its output."""
    registry = ref.split("/", 1)[0]
    if local != ref:
        engine.docker("tag", local, ref)
    try:
        with registry_auth.docker_env(registry) as env:
            return oci.retry(f"pushing `{ref}`", registry,
                             lambda: engine.docker("push", ref, timeout=timeout, env=env),
                             (CommandFailed,)).stdout
    finally:
        if untag and local != ref:
            engine.docker("image", "rm", ref, check=False)


def stage(matrix: Matrix, image_id: str, hash_tag: str, *,
          evidence_files: Mapping[str, bytes] | None = None,
          key: keypair.SigningKey | None = None, cache: str | None = None,
          base: tuple[str, str] | None = None, label: str = "") -> Staged:
    """Stage, in this order: the image by its content tag in the staging repository (checked
    by digest), the build cache image `cache` (kept locally under that name), the base
    (`(local ref, registry ref)`, pushed when the registry lacks it), then the evidence files
    attached to the staged digest (signed with `key`). Returns the staged image."""
    staged = stage_image(matrix, image_id, hash_tag)
    if cache and engine.inspect_image(cache) is not None:
        best_effort(label, "the cache image was not pushed" + (" and signed" if key else ""),
                    "the next cold build installs every layer again",
                    lambda: push_cache(matrix, cache, key, label))
    if base:
        best_effort(label, "the base was not kept in the registry", "`builder reproduce` "
                    "needs the exact base", lambda: push_base(*base))
    attach_all(staged, evidence_files or {}, key)
    return staged


def stage_image(matrix: Matrix, image_id: str, hash_tag: str) -> Staged:
    """The local image in the staging repository under its content tag (the local tag is
    removed again); fails unless the registry then holds that very image."""
    ref = f"{matrix.staging_registry}/{matrix.staging_repository}:{hash_tag}"
    push(image_id, ref)
    staged = find_staged(matrix, hash_tag)
    if staged is None or staged.image_id != image_id:
        raise oci.RegistryError(f"`{ref}` does not hold image {image_id[:19]} after the push")
    return staged


def push_cache(matrix: Matrix, cache: str, key: keypair.SigningKey | None, label: str) -> None:
    """The build cache image pushed under its tag `cache-<tag>` and, with a key, the digest the
    engine reports pushing (never one read back from the tag, which anyone with push rights may
    have replaced meanwhile) signed naming that tag: a build takes the registry's cache only so
    (builder.stages.signed_cache)."""
    digest = pushed_digest(push(cache, cache, untag=False))
    if key is None:
        return
    if not digest:
        raise BuilderError(f"`docker push {cache}` reported no digest to sign")
    sign.sign_image(oci.Registry(matrix.staging_registry), matrix.staging_repository, digest,
                    key, sign.tag_annotations(label, [cache.rsplit(":", 1)[1]]))


def pushed_digest(push_output: str) -> str:
    """The manifest digest `docker push` reports; "" when it reports none."""
    found = PUSHED_DIGEST.findall(push_output)
    return found[-1] if found else ""


def push_base(local: str, ref: str) -> None:
    """A locally bootstrapped base kept in the registry, unless it is there already."""
    registry, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    if oci.Registry(registry).head(repository, tag):
        return
    push(local, ref, timeout=1800)


def attach_all(staged: Staged, files: Mapping[str, bytes], key: keypair.SigningKey | None) -> None:
    """Each evidence file attached to the staged digest (with its signed attestation)."""
    for kind, data in files.items():
        attach(staged, kind, data, key=key)


def best_effort(label: str, what: str, consequence: str, fn: Callable[[], None]) -> None:
    """`fn()`; a registry or engine failure is one warning line (the caller goes on)."""
    try:
        fn()
    except BuilderError as exc:
        step(f"  {f'[{label}] ' if label else ''}warning: {what} ({exc}); {consequence}")
