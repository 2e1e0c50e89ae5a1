"""The catalog's pod snippet, as a platform team pastes it: valid against Kubernetes' own schema
(`kubernetes-validate`, strict), admitted by Pod Security "restricted", pinned to the zstd twin;
and every `docker run` line that mounts the current folder runs as the caller.

The Pod Security Standards have no validator on PyPI, so `violations` encodes the "baseline" and
"restricted" rules from https://kubernetes.io/docs/concepts/security/pod-security-standards/
(the tables "Baseline" and "Restricted", Kubernetes v1.3x), one check per row.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from builder.model import catalog_page as howto

GZIP = "r:5000/torch@sha256:" + "a" * 64
ZSTD = "r:5000/torch@sha256:" + "b" * 64
CUDA = {"accelerator": "cuda", "flavor": "runtime", "python": "3.11"}
CPU = {"accelerator": "cpu", "flavor": "slim", "python": "3.11"}
KUBERNETES = "1.37.0"  # the newest schema kubernetes-validate ships

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                      "persistentVolumeClaim", "projected", "secret"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("containers", "initContainers", "ephemeralContainers")
            for c in spec.get(key) or []]


def contexts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's security context and each container's (the rules apply to both)."""
    return [spec.get("securityContext") or {}] + [c.get("securityContext") or {}
                                                   for c in containers(spec)]


def baseline(spec: dict[str, Any]) -> list[str]:
    out = [f"host namespace: {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    for ctx in contexts(spec):
        if (ctx.get("windowsOptions") or {}).get("hostProcess"):
            out.append("hostProcess")
        if ctx.get("privileged"):
            out.append("privileged")
        if ctx.get("procMount", "Default") != "Default":
            out.append("procMount")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append("seccomp Unconfined")
        if (ctx.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append("AppArmor Unconfined")
        selinux = ctx.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or {"user", "role"} & set(selinux):
            out.append("seLinuxOptions")
        out += [f"capability {c}" for c in (ctx.get("capabilities") or {}).get("add") or []
                if c not in BASELINE_CAPS]
    out += [f"sysctl {s['name']}" for s in (spec.get("securityContext") or {}).get("sysctls")
            or [] if s["name"] not in SAFE_SYSCTLS]
    out += [f"hostPort {p['hostPort']}" for c in containers(spec) for p in c.get("ports") or []
            if p.get("hostPort")]
    return out


def violations(pod: dict[str, Any]) -> list[str]:
    """Why Pod Security "restricted" would reject the pod ([] when it admits it)."""
    spec = pod["spec"]
    pod_ctx = spec.get("securityContext") or {}
    out = baseline(spec)
    out += [f"volume type of {v['name']}" for v in spec.get("volumes") or []
            if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in containers(spec):
        ctx = c.get("securityContext") or {}
        caps = ctx.get("capabilities") or {}
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {
                "NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities do not drop ALL")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot is not true")
        profile = ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}
        if profile.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile is not RuntimeDefault or Localhost")
    out += ["runAsUser 0" for ctx in contexts(spec) if ctx.get("runAsUser") == 0]
    return out


@pytest.mark.parametrize(("image", "user"), [(CUDA, "1000:1000"), (CPU, "1000:1000"),
                                             (CUDA, "0:0"), (CPU, None)])
def test_the_pod_is_valid_restricted_and_pins_the_zstd_twin(image: dict, user: str) -> None:
    text = howto.pod_manifest(image, GZIP, {"user": user}, ZSTD)
    pod = yaml.safe_load(text)
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)  # raises when off the schema
    assert violations(pod) == []
    [container] = pod["spec"]["containers"]
    assert container["image"] == ZSTD
    assert f"on Docker 20.10 use the gzip digest:\n      #   {GZIP}" in text
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000  # a root image runs as 1000
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["spec"]["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) == (image is CUDA)


def test_without_a_twin_the_pod_pins_the_gzip_digest() -> None:
    text = howto.pod_manifest(CPU, GZIP, {"user": "1000:1000"})
    assert yaml.safe_load(text)["spec"]["containers"][0]["image"] == GZIP
    assert "zstd" not in text


def test_the_rules_reject_what_restricted_rejects() -> None:
    pod = yaml.safe_load(howto.pod_manifest(CUDA, GZIP, {"user": "1000:1000"}, ZSTD))
    [container] = pod["spec"]["containers"]
    del container["securityContext"]["allowPrivilegeEscalation"]
    container["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    pod["spec"]["securityContext"] = {"runAsUser": 0}
    pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert len(violations(pod)) == 8


def test_every_run_line_that_mounts_the_folder_runs_as_the_caller() -> None:
    for image in (CPU, CUDA):
        for _, command in howto.run_commands(image, GZIP):
            assert ("-v " not in command) or howto.AS_CALLER in command
    mounting = [c for _, c in howto.run_commands(CPU, GZIP) if "$PWD" in c]
    assert mounting and all('--user "$(id -u):$(id -g)"' in c for c in mounting)
