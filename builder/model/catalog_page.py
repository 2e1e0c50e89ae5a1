"""What an image page tells a platform team before it runs an image, as NGC's and Chainguard's
pages do: how to run it (docker, a Kubernetes pod), its specifications (from the image config
and the SBOM), the exact commands that verify it, and what its smoke tests proved (on a GPU, a
CPU stand-in, or not applicable). Pure functions of catalog.json's facts: the templates print
their results and hold no command strings of their own.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from builder.core.keyless import GITHUB_ISSUER
from builder.core.output import human_bytes
from builder.model import accelerators, layer_reuse
from smoke.checks import GPU_CHECKS
from smoke.versions import numeric

SHM = {"cuda": "8g", "cpu": "2g"}  # NCCL wants 512 MiB a GPU; DataLoader workers share /dev/shm
STAND_IN = ("skip", "substituted", "degraded")  # a GPU check that did not fully run on a GPU


# ---- smoke tests ------------------------------------------------------------------------------


def smoke_verdict(smoke: dict[str, Any], accelerator: str) -> dict[str, str]:
    """What a smoke report proved. `state`: gpu (every GPU check passed on a GPU), stand-in (a
    CUDA image smoked without a GPU: its GPU checks ran on the CPU or not at all; amber, never
    counted as GPU-smoked), not-applicable (a CPU image: there is no CUDA to check), fail,
    missing. `css`: the status class the page colours it with."""
    if not smoke.get("present"):
        return {"state": "missing", "css": "fail", "line": "no smoke report",
                "short": "no smoke report"}
    emulated = " (emulated)" if smoke.get("emulated") else ""
    if smoke.get("status") != "pass":
        return {"state": "fail", "css": "fail", "line": f"{smoke.get('status')}{emulated}",
                "short": f"{smoke.get('status')}{emulated}"}
    if not accelerators.needs_gpu_evidence(accelerator):
        return {"state": "not-applicable", "css": "pass",
                "line": f"pass on CPU{emulated}; GPU checks not applicable (CPU image)",
                "short": f"pass (CPU image){emulated}"}
    host = smoke.get("host") or {}
    gpus = host.get("gpus") or []
    gpu_checks = [c for c in smoke.get("checks") or [] if c.get("name") in GPU_CHECKS]
    if gpus and gpu_checks and all(c.get("status") == "pass" for c in gpu_checks):
        where = host.get("summary") or \
            f"{len(gpus)}× {gpus[0]['name']}, driver {host.get('driver') or '?'}"
        return {"state": "gpu", "css": "pass", "line": f"pass on GPU: {where}{emulated}",
                "short": f"pass on GPU{emulated}"}
    return {"state": "stand-in", "css": "standin",
            "line": f"CPU stand-in{emulated}: passed without a GPU (GPU checks ran on the CPU "
                    "or were skipped); not yet checked on a GPU",
            "short": f"CPU stand-in: no GPU{emulated}"}


def check_status(check: dict[str, Any], accelerator: str) -> tuple[str, str]:
    """(what a check's row says, its css class): a CPU image's GPU checks are `not applicable`,
    a CUDA image's GPU checks that did not run on a GPU are `CPU stand-in`."""
    status = str(check.get("status", "?"))
    if check.get("name") not in GPU_CHECKS or status not in STAND_IN:
        return status, status
    if not accelerators.needs_gpu_evidence(accelerator):
        return "not applicable", "na"
    return {"skip": "not run: no GPU", "substituted": "CPU stand-in"}.get(
        status, f"{status} (not fully on a GPU)"), "standin"


def smoke_counts(verdicts: list[dict[str, str]]) -> dict[str, int]:
    """How many images each verdict covers (the index's summary line)."""
    out = {"gpu": 0, "stand-in": 0, "not-applicable": 0, "fail": 0, "missing": 0}
    for verdict in verdicts:
        out[verdict["state"]] += 1
    return out


# ---- which tag to pull --------------------------------------------------------------------------

TWIN_RUNTIMES = ("Kubernetes nodes (containerd ≥ 1.5), Docker Engine ≥ 23, CRI-O, podman: "
                 "the same image (same config, diff ids and evidence, signed alike), unpacked "
                 "several times faster")
GZIP_RUNTIMES = "every runtime, Docker 20.10 included (it cannot unpack zstd)"


def relation_words(relation: str, image: dict[str, Any], other: dict[str, Any]) -> str:
    """What the held image of an "if your node already has" row is (builder.model.layer_reuse)."""
    if relation == layer_reuse.REBUILD:
        return "the build before (the weekly rebuild)"
    if relation == "torch":
        side = "before" if numeric(other.get("torch")) < numeric(image.get("torch")) else "after"
        return f"the torch {side}: {other.get('torch')}"
    return f"another {relation}: {other.get(relation)}"


def pull_choices(doc: dict[str, Any], variant: dict[str, Any], tag: str
                 ) -> list[tuple[str, str]]:
    """(who should pull it, how) for a tag and its `-zstd` twin (a pod's `image:`, since
    Docker 20.10 cannot pull it); [] when this tag has no twin."""
    twin = twin_record(variant, tag)
    if not twin:
        return []
    name = f"{doc['registry']}/{doc['repository']}"
    return [(f"gzip layers, {human_bytes(twin['gzip_size'])}: {GZIP_RUNTIMES}",
             f"docker pull {name}:{tag}"),
            (f"zstd layers, {human_bytes(twin['size'])}: {TWIN_RUNTIMES}",
             f"image: {name}:{twin['tag']}")]


def twin_record(variant: dict[str, Any], tag: str) -> dict[str, Any] | None:
    """The catalog's twin record of the floating tag or of one of its dated tags."""
    if tag == variant["tag"]:
        return variant.get("zstd")
    return next((h.get("zstd") for h in variant.get("history") or [] if h["tag"] == tag), None)


def startup_words(startup: dict[str, Any] | None) -> str:
    """The "bytes needed to start" cell: the measured working set and its share of the
    unpacked image, or "not measured"."""
    if not startup:
        return "not measured"
    share = f" ({startup['share']:.0%} of {human_bytes(startup['image_bytes'])})" \
        if startup.get("share") is not None else ""
    other = "" if startup["same_digest"] else "; measured on another build of this variant"
    return f"{human_bytes(startup['bytes'])}{share}, {startup['files']} files{other}"


# ---- how to run it ----------------------------------------------------------------------------


AS_CALLER = '--user "$(id -u):$(id -g)"'
DEFAULT_UID = 1000  # the images' `user`; any uid works (HOME is mode 1777: README, *Any uid*)
RESTRICTED = ("https://kubernetes.io/docs/concepts/security/pod-security-standards/"
              "#restricted")


def run_commands(image: dict[str, Any], reference: str) -> list[tuple[str, str]]:
    """(what it does, the docker command) for this image. A command that mounts the current
    folder runs as the caller's uid and gid: the image's user (uid 1000) cannot write into a
    folder it does not own, which a home or a checkout often is (README, *Any uid*)."""
    shm = SHM["cuda" if image["accelerator"] == "cuda" else "cpu"]
    if image["accelerator"] != "cuda":
        return [("a python shell", f"docker run --rm -it --shm-size={shm} {reference}"),
                ("a script from this folder (run as you, so its outputs are yours)",
                 f"docker run --rm --shm-size={shm} {AS_CALLER} "
                 f'-v "$PWD:/work" -w /work {reference} python train.py')]
    return [("a python shell on every GPU",
             f"docker run --rm -it --gpus all --shm-size={shm} {reference}"),
            ("NCCL across GPUs: the host's IPC namespace instead of a sized /dev/shm",
             f"docker run --rm -it --gpus all --ipc=host {reference}"),
            ("check a GPU node (exit 0: every GPU check passed on a GPU)",
             f"docker run --rm --gpus all --shm-size={shm} {reference} "
             "torch-smoke --require-gpu")]


def pod_manifest(image: dict[str, Any], reference: str, config: dict[str, Any],
                 twin: str | None = None) -> str:
    """A Kubernetes pod that runs the image: the zstd twin's digest when there is one (what
    containerd and CRI-O unpack fastest; the gzip digest is named for Docker 20.10 nodes), a
    GPU limit for a CUDA image, a memory-backed /dev/shm (a pod's default is 64 MiB), and a
    security context that Pod Security "restricted" admits (non-root, no privilege
    escalation, no capabilities, the runtime's default seccomp profile). An image whose user
    is root runs as uid 1000."""
    cuda = image["accelerator"] == "cuda"
    name = f"torch-{image.get('flavor') or 'image'}"
    uid = user_id(config.get("user")) or DEFAULT_UID
    command = ["python", "-c", "import torch; print(torch.__version__, "
               + ("torch.cuda.device_count())" if cuda else "torch.get_num_threads())")]
    limits = "nvidia.com/gpu: 1" if cuda else "cpu: \"4\", memory: 16Gi"
    shm = "8Gi" if cuda else "2Gi"
    which = (f"      # the zstd twin (containerd >= 1.5, CRI-O); on Docker 20.10 use the gzip "
             f"digest:\n      #   {reference}\n" if twin else "")
    return (f"# passes Pod Security \"restricted\": {RESTRICTED}\n"
            f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n"
            "  restartPolicy: Never\n  securityContext:\n"
            f"    runAsNonRoot: true\n    runAsUser: {uid}\n    runAsGroup: {uid}\n"
            "    seccompProfile: {type: RuntimeDefault}\n  containers:\n"
            f"    - name: torch\n{which}      image: {twin or reference}\n"
            f"      command: {json.dumps(command)}\n"
            "      securityContext:\n        allowPrivilegeEscalation: false\n"
            "        capabilities: {drop: [ALL]}\n"
            f"      resources:\n        limits: {{{limits}}}\n"
            "      volumeMounts:\n        - {name: dshm, mountPath: /dev/shm}\n"
            "  volumes:\n    - name: dshm\n"
            f"      emptyDir: {{medium: Memory, sizeLimit: {shm}}}\n")


def user_id(user: str | None) -> int | None:
    """The numeric uid of a config's `User` (`1000:1000` → 1000); None for root or a name."""
    uid = (user or "").split(":")[0]
    return int(uid) if uid.isdigit() and int(uid) != 0 else None


# ---- specifications ---------------------------------------------------------------------------


def specifications(image: dict[str, Any], platform: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, value) rows read from the image config and the SBOM, as Chainguard's
    specifications view lists them."""
    config = platform.get("config") or {}
    env = dict(e.split("=", 1) for e in config.get("env") or [] if "=" in e)
    uid = user_id(config.get("user"))
    user = config.get("user") or "not set"
    who = f"{user} (uid {uid}, not root)" if uid else f"{user} (root)"
    sbom = (platform.get("evidence") or {}).get("sbom") or {}
    shells = sbom.get("shells")
    shell = ("no SBOM to tell" if not sbom.get("present") or shells is None else
             f"yes: {', '.join(shells)} (/bin/sh)" if shells else "none in the SBOM")
    venv = env.get("VIRTUAL_ENV")
    python = f"python {image.get('python') or '?'}" + (
        f": `python` is {venv}/bin/python, first on PATH" if venv else "")
    return [("user", who), ("entrypoint", argv(config.get("entrypoint"))),
            ("command", argv(config.get("cmd"))), ("working folder", config.get("workdir") or "/"),
            ("shell", shell), ("python", python),
            ("environment", "\n".join(config.get("env") or []) or "none")]


def argv(args: list[str] | None) -> str:
    return shlex.join(args) if args else "none"


# ---- how to verify it -------------------------------------------------------------------------


def verify_commands(reference: str, signature: dict[str, Any], key_file: str,
                    source: str | None) -> list[tuple[str, str]]:
    """(what it checks, the command): the one place the page's verify commands are written.
    Key signatures carry no Rekor entry (builder signs offline), so stock cosign 2.x needs
    `--insecure-ignore-tlog=true` for them; a keyless signature (CI's) is checked against the
    workflow identity of the image's source repository."""
    key = shlex.quote(key_file)
    out = [("signature, smoke report, SBOM and provenance (builder)",
            f"builder verify --key {key} {reference}")]
    if signature.get("present"):
        out.append(("the signature (stock cosign)",
                    f"cosign verify --key {key} --insecure-ignore-tlog=true {reference}"))
        out += [(f"the signed attestation {ptype}",
                 f"cosign verify-attestation --key {key} --insecure-ignore-tlog=true "
                 f"--type {shlex.quote(ptype)} {reference}")
                for ptype in signature.get("attestations") or []]
    out += identity_commands(reference, signature.get("identities") or [])
    if signature.get("keyless"):
        repo = (source or "https://github.com/YOUR-ORG/torch-images").removesuffix(".git")
        identity = f"{repo}/.github/workflows/build.yml@refs/heads/main"
        out.append(("the keyless signature CI made (its workflow identity)",
                    f"cosign verify --certificate-identity {shlex.quote(identity)} "
                    f"--certificate-oidc-issuer {GITHUB_ISSUER} {reference}"))
    return out


def identity_commands(reference: str, identities: list[dict[str, str]]
                      ) -> list[tuple[str, str]]:
    """The commands that pin who signed the image's sigstore bundles: builder's, cosign's (the
    bundle format) and GitHub's (`gh attestation verify`, which reads the bundles from the
    registry's referrers); the GitHub repository is the one the workflow identity names."""
    out = []
    for who in identities:
        subject, issuer = shlex.quote(who["subject"]), shlex.quote(who["issuer"])
        pinned = f"--certificate-identity {subject} --certificate-oidc-issuer {issuer}"
        trusted = "a trusted identity" if who.get("trusted") else "not an identity given as trusted"
        out += [(f"signed keylessly by {who['subject']} ({trusted}; builder)",
                 f"builder verify {pinned} {reference}"),
                ("the same with stock cosign", f"cosign verify {pinned} {reference}")]
        repo = re.match(r"https://github\.com/([^/]+/[^/]+)/\.github/workflows/", who["subject"])
        if repo:
            out.append(("the same with GitHub's CLI",
                        f"gh attestation verify oci://{reference} --bundle-from-oci "
                        f"--repo {repo[1]} --cert-identity {subject} "
                        f"--cert-oidc-issuer {issuer}"))
    return out


def key_name(index: int, count: int) -> str:
    """The file name a public key gets in the site (`keys/cosign.pub`, or one per key)."""
    return "cosign.pub" if count == 1 else f"cosign-{index + 1}.pub"


def key_href(name: str) -> str:
    return str(PurePosixPath("keys") / name)
