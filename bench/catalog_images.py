"""Small FROM-scratch images published as the pipeline publishes them, for the catalog's e2e test
and bench: pushed straight through the registry client (no engine, so 200 tags take seconds).

Each image has one layer per layer group with the `created_by` of the Dockerfile template's step
(so the catalog groups them as it groups a real image), the pipeline's labels, and an SBOM
(CycloneDX 1.6), a smoke report (the suite's schema) and SLSA provenance
(`builder.stages.provenance.statement`) attached to each platform manifest; a multi-platform
image is an OCI index of them. Then the dated tag, the `build-<hash>` tag and the floating tag
point at it, as `builder publish` does. Optional: an audit report, a rebuild reason, a cosign
signature and a signed SBOM attestation (builder.core.sign).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import json
import tarfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import keypair, labels, media, oci, sign
from builder.flows import rebuild
from builder.model import platforms
from builder.stages import provenance, twin
from smoke.checks import CHECKS, GPU_CHECKS

# The step of each layer group, as the image config's history shows it (BuildKit's form).
CREATED_BY = {
    "base": "ADD rootfs.tar.xz / # mmdebstrap",
    "python": "RUN |1 APT_REFRESH= /bin/sh -c apt-get update && apt-get install -y python3 "
              "&& useradd user && python3 -m venv /opt/venv # buildkit",
    "nvidia": "RUN /bin/sh -c uv pip install --require-hashes --no-deps --link-mode copy "
              "--target /opt/nvidia/lib/python3/site-packages -r /mnt/build/set/requirements.txt"
              " # buildkit",
    "torch": "RUN /bin/sh -c uv pip install --require-hashes --no-deps --link-mode copy "
             "-r /mnt/build/set/requirements.txt # buildkit",
    "packages": "RUN /bin/sh -c uv pip install --require-hashes --no-deps --link-mode copy "
                "-r /mnt/build/set/requirements.txt # buildkit",
    "toolchain": "RUN /bin/sh -c echo 'path-exclude=...' > /etc/dpkg/dpkg.cfg.d/"
                 "torch-images-compiler && apt-get install -y g++ libpython3-dev # buildkit",
}
# What the Dockerfile template's last steps set (USER, ENV, WORKDIR, CMD).
RUN_CONFIG = {"User": "1000:1000", "WorkingDir": "/home/user", "Cmd": ["python"],
              "Env": ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
                      "/bin", "LANG=C.UTF-8", "HOME=/home/user", "VIRTUAL_ENV=/opt/venv"]}
# Bytes per layer group: small, but in the proportions of a real image.
GROUP_BYTES = {"base": 24_000, "python": 9_000, "nvidia": 40_000, "torch": 30_000,
               "packages": 4_000, "toolchain": 16_000}
ARCHS_CUDA13 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
ARCHS_CUDA12 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "compute_90")


@dataclass(frozen=True)
class Spec:
    """One variant, as its labels describe it."""

    torch: str
    python: str
    flavor: str
    cuda: str | None = None  # None: a CPU image
    platforms: tuple[str, ...] = ("linux/amd64",)
    packages: Mapping[str, str] = field(default_factory=lambda: {"numpy": "2.3.5",
                                                                  "filelock": "3.20.0"})

    @property
    def floating(self) -> str:
        acc = f"cuda{self.cuda}-cudnn9" if self.cuda else "cpu"
        return f"{self.torch.split('+')[0]}-py{self.python}-{acc}-{self.flavor}"

    @property
    def groups(self) -> list[str]:
        nvidia = ["nvidia"] if self.cuda else []
        toolchain = [] if self.flavor == "slim" else ["toolchain"]
        return ["base", "python", *nvidia, "torch", "packages", *toolchain]

    def labels(self, platform: str, revision: str) -> dict[str, str]:
        cuda = self.cuda or ""
        major = cuda.split(".")[0]
        min_driver = {"13": "580.65.06", "12": "570.26"}.get(major, "")
        found = {
            labels.TORCH: self.torch, labels.PYTHON: self.python,
            labels.ACCELERATOR: "cuda" if cuda else "cpu", labels.CUDA: cuda,
            labels.CUDNN: "9.13.0" if cuda else "", labels.NCCL: "2.28.3" if cuda else "",
            labels.FLAVOR: self.flavor, labels.MIN_DRIVER: min_driver,
            labels.VARIANT: self.floating, labels.CONTENT_HASH: hashlib.sha256(
                f"{self.floating}{platform}{revision}".encode()).hexdigest(),
            labels.LOCK_HASH: hashlib.sha256(json.dumps(dict(self.packages)).encode()).hexdigest(),
            labels.OCI + "revision": revision,
            labels.OCI + "source": "https://github.com/torch-images/torch-images",
            labels.OCI + "base.name": "mmdebstrap:bookworm",
            labels.OCI + "base.digest": "sha256:" + hashlib.sha256(b"bookworm").hexdigest(),
        }
        return {k: v for k, v in found.items() if v}

    @property
    def archs(self) -> list[str] | None:
        major = (self.cuda or "").split(".")[0]
        return None if not major else list(ARCHS_CUDA13 if major == "13" else ARCHS_CUDA12)


def layer(group: str, key: str) -> tuple[bytes, bytes]:
    """(gzip blob, uncompressed tar) of one layer: pseudo-random bytes named by `key`."""
    size = GROUP_BYTES[group]
    seed = hashlib.sha256(key.encode()).digest()
    payload = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
                       for i in range(size // 32 + 1))[:size]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"opt/{group}/data.bin")
        info.size, info.mtime = len(payload), 0
        tar.addfile(info, io.BytesIO(payload))
    return gzip.compress(raw.getvalue(), mtime=0), raw.getvalue()


def sbom_document(spec: Spec, subject: str) -> dict[str, Any]:
    comps = [{"type": "library", "bom-ref": f"pkg:pypi/{n}@{v}", "name": n, "version": v,
              "purl": f"pkg:pypi/{n}@{v}"}
             for n, v in sorted({"torch": spec.torch, **spec.packages}.items())]
    comps += [{"type": "library", "bom-ref": f"pkg:deb/debian/{n}@{v}", "name": n, "version": v,
               "purl": f"pkg:deb/debian/{n}@{v}?distro=debian-12"}
              for n, v in (("libc6", "2.36-9+deb12u13"), ("python3.11", "3.11.2-6+deb12u6"),
                           ("dash", "0.5.12-2"), ("bash", "5.2.15-2+b7"))]
    return {"bomFormat": "CycloneDX", "specVersion": "1.6",
            "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, subject)}", "version": 1,
            "metadata": {"timestamp": "2026-12-01T00:00:00Z",
                         "component": {"type": "container", "bom-ref": "image",
                                       "name": spec.floating, "version": subject}},
            "components": comps}


def check(name: str, status: str, message: str,
          metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "duration_s": 1.0, "message": message,
            "metrics": metrics or {}}


def smoke_report(spec: Spec, platform: str, image_id: str) -> dict[str, Any]:
    checks = []
    for name in CHECKS:  # every check the suite has, as a CPU host reports them
        if name == "env":
            checks.append(check(name, "pass", "versions match the facts", {"actual": {
                "torch": spec.torch, "cuda_arch_flags": spec.archs}}))
        elif name in GPU_CHECKS:  # as smoke.checks.common.stand_in_status and cuda.py say
            if name == "cuda":
                checks.append(check(name, "skip", "no GPU on this host" if spec.cuda
                                    else "cpu image: no CUDA to check"))
            else:
                checks.append(check(name, "substituted", f"{name} on cpu (CPU stand-in: no GPU "
                                    "on this host)") if spec.cuda else
                              check(name, "pass", f"{name} on cpu"))
        elif name == "compile" and spec.flavor == "slim":
            checks.append(check(name, "skip", "this slim image is compiler-free"))
        else:
            checks.append(check(name, "pass", f"{name} on cpu"))
    return {"schema_version": 1, "tool": {"name": "smoke", "version": "0.1.0"},
            "image": {"ref": spec.floating, "id": image_id, "digest": None},
            "facts": {"torch": spec.torch, "python": spec.python,
                      "accelerator": "cuda" if spec.cuda else "cpu", "cuda": spec.cuda,
                      "cudnn": "9.13.0" if spec.cuda else None,
                      "flavor": spec.flavor},
            "facts_source": "/opt/torch-images/image.json",
            "host": {"kernel": "6.1.0", "machine": platform.split("/")[1], "cpu_count": 2,
                     "gpus": [], "driver": None},
            "require_gpu": False, "started": "2026-12-01T00:00:00+00:00",
            "finished": "2026-12-01T00:01:00+00:00", "status": "pass", "checks": checks,
            "platform": platform, "emulated": platform != "linux/amd64"}


def push_platform(reg: oci.Registry, repo: str, spec: Spec, platform: str,
                  revision: str) -> oci.Descriptor:
    """One platform's image manifest with its evidence attached."""
    image_labels = spec.labels(platform, revision)
    blobs, diff_ids, history = [], [], []
    for group in spec.groups:
        # Layers below `packages` are shared by every flavor and build of a torch/python pair.
        key = f"{spec.torch}|{spec.python}|{spec.cuda}|{platform}|{group}"
        if group == "packages":
            key += json.dumps(dict(spec.packages), sort_keys=True)
        elif group == "toolchain":
            key += spec.flavor
        gz, raw = layer(group, key)
        blobs.append({"mediaType": oci.OCI_LAYER_GZIP, "digest": reg.push_blob(repo, gz),
                      "size": len(gz)})
        diff_ids.append(oci.sha256(raw))
        history.append({"created_by": CREATED_BY[group]})
    arch = platforms.get(platform).as_oci()
    config = json.dumps({**arch, "created": "2026-12-01T00:00:00Z",
                         "config": {"Labels": image_labels, **RUN_CONFIG},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids},
                         "history": history}, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
        "config": {"mediaType": oci.OCI_CONFIG, "digest": reg.push_blob(repo, config),
                   "size": len(config)},
        "layers": blobs}, sort_keys=True).encode()
    digest = reg.put_manifest(repo, oci.sha256(manifest), manifest, oci.OCI_MANIFEST)
    desc = oci.Descriptor(digest, oci.OCI_MANIFEST, len(manifest))
    name = f"{reg.registry}/{repo}"
    attach(reg, repo, desc, "sbom", sbom_document(spec, digest))
    attach(reg, repo, desc, "smoke", smoke_report(spec, platform, oci.sha256(config)))
    attach(reg, repo, desc, "provenance", provenance.statement(name, digest, image_labels))
    return desc


def attach(reg: oci.Registry, repo: str, subject: oci.Descriptor, kind: str,
           doc: dict[str, Any]) -> None:
    known = media.KINDS.get(kind)
    media_type = known.media_type if known else f"application/vnd.torch-images.{kind}+json"
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    reg.push_artifact(repo, subject, media_type, data, kind=kind, title=f"{kind}.json")


def signing_key(seed: int = 1) -> keypair.SigningKey:
    """A fixed P-256 key (a test key: its private value is `seed`)."""
    return keypair.SigningKey(ec.derive_private_key(seed, ec.SECP256R1()))


def publish(reg: oci.Registry, repo: str, spec: Spec, date: str, *, revision: str = "0" * 40,
            reasons: tuple[str, ...] = (), vulnerabilities: int | None = None,
            key: keypair.SigningKey | None = None, zstd: bool = False) -> str:
    """Push `spec` for its platforms and tag it `<floating>-<date>`, `build-…` and `<floating>`
    (a dated tag already taken gets `.1`, `.2`…); returns the digest the tags point at.
    `zstd`: each of those tags gets its `<tag>-zstd` twin too (builder.stages.twin)."""
    descs = [push_platform(reg, repo, spec, p, revision) for p in spec.platforms]
    if len(descs) == 1:
        top = descs[0]
    else:
        index = platforms.index_document([platforms.PlatformManifest(platforms.get(p), d)
                                          for p, d in zip(spec.platforms, descs, strict=True)])
        top = reg.push_index(repo, index)
    first = descs[0]
    if reasons:  # what `builder rebuild` attaches after it published
        action = rebuild.Action(variant_id=spec.floating, reasons=list(reasons))
        rebuild.record_reasons(
            {"registry": reg.registry, "repository": repo, "digest": first.digest},
            action, [rebuild.Finding(variant_id=spec.floating, reason=r, status=rebuild.REBUILD,
                                     detail=f"{r}: fixed upstream") for r in reasons])
    if vulnerabilities is not None:
        attach(reg, repo, first, "audit", {
            "sources": {"pypi": {"status": "ok"}, "debian-security": {"status": "ok"}},
            "vulnerabilities": [{"id": f"CVE-2026-{i:04d}"} for i in range(vulnerabilities)],
            "ok": vulnerabilities == 0, "audited_at": dt.date.today().isoformat()})
    taken = set(reg.tags(repo))
    dated, n = f"{spec.floating}-{date}", 0
    while dated in taken and reg.head(repo, dated).digest != top.digest:
        n += 1
        dated = f"{spec.floating}-{date}.{n}"
    tags = (dated, f"build-{top.digest[7:27]}", spec.floating)
    if key is not None:  # signed as `builder publish --key` signs: the image, naming its tags,
        # and its evidence
        sign.sign_image(reg, repo, top.digest, key, sign.tag_annotations(spec.floating, tags))
        sign.attest(reg, repo, top.digest, key, "sbom", sbom_document(spec, first.digest))
    for tag in tags:
        reg.tag(repo, top.digest, tag)
    if zstd:
        pair = twin.make(reg, repo, top.digest)
        for tag in tags:
            reg.tag(repo, pair.digest, twin.tag_of(tag))
    return top.digest


def many(count: int) -> list[Spec]:
    """`count` distinct variants (for the bench): torch x python x accelerator x flavor."""
    specs = []
    for i in range(count):
        torch = f"2.{i // 24}.{i % 3}"
        cuda = (None, "12.8", "13.2")[i % 3]
        specs.append(Spec(torch=torch, python=("3.11", "3.12", "3.13", "3.14")[i // 3 % 4 % 4],
                          flavor=("slim", "runtime", "devel")[i // 12 % 3], cuda=cuda,
                          platforms=("linux/amd64", "linux/arm64") if cuda == "13.2"
                          else ("linux/amd64",)))
    return specs
