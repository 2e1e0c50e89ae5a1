"""What an image page tells a platform team: smoke verdicts, run and verify commands,
specifications, and one audit answer for every part of the page."""

from __future__ import annotations

import json
import shlex

import yaml

from bench.catalog_images import RUN_CONFIG, Spec, smoke_report
from builder.model import catalog_doc
from builder.model import catalog_page as howto
from builder.stages import catalog
from sbom.diff import component_counts, count_line

REF = "r:5000/torch@sha256:" + "a" * 64
CUDA = {"accelerator": "cuda", "flavor": "runtime", "python": "3.11"}
CPU = {"accelerator": "cpu", "flavor": "slim", "python": "3.11"}


def summary(spec: Spec) -> dict:
    data = json.dumps(smoke_report(spec, "linux/amd64", "sha256:" + "b" * 64)).encode()
    return {"present": True, **catalog.summarise("smoke", data, "sha256:" + "c" * 64)}


def test_a_cuda_image_smoked_without_a_gpu_is_a_cpu_stand_in_never_gpu_smoked() -> None:
    smoke = summary(Spec(torch="2.15.0", python="3.11", flavor="slim", cuda="13.2"))
    verdict = howto.smoke_verdict(smoke, "cuda")
    assert (verdict["state"], verdict["css"]) == ("stand-in", "standin")
    assert "not yet checked on a GPU" in verdict["line"]
    rows = {c["name"]: howto.check_status(c, "cuda") for c in smoke["checks"]}
    assert rows["cudnn_conv"] == ("CPU stand-in", "standin")
    assert rows["amp_train"] == ("CPU stand-in", "standin")
    assert rows["cuda"] == ("not run: no GPU", "standin")
    assert howto.smoke_counts([verdict])["gpu"] == 0
    # GPUs listed but a GPU check only substituted: still a stand-in.
    smoke["host"]["gpus"] = [{"name": "NVIDIA H100", "capability": "9.0"}]
    assert howto.smoke_verdict(smoke, "cuda")["state"] == "stand-in"


def test_a_cpu_image_has_no_gpu_checks_to_run_not_applicable() -> None:
    smoke = summary(Spec(torch="2.13.0+cpu", python="3.11", flavor="slim"))
    verdict = howto.smoke_verdict(smoke, "cpu")
    assert verdict["state"] == "not-applicable" and "not applicable" in verdict["line"]
    rows = {c["name"]: howto.check_status(c, "cpu") for c in smoke["checks"]}
    assert rows["cuda"] == ("not applicable", "na") and rows["env"] == ("pass", "pass")
    assert rows["cudnn_conv"] == ("pass", "pass")  # a CPU run is the real thing on a CPU image
    assert howto.smoke_verdict({"present": False}, "cpu")["state"] == "missing"
    assert howto.smoke_verdict({**smoke, "status": "fail"}, "cpu")["css"] == "fail"


def test_the_run_commands_and_the_pod_give_gpus_and_shared_memory() -> None:
    cuda = [cmd for _, cmd in howto.run_commands(CUDA, REF)]
    assert cuda[0] == f"docker run --rm -it --gpus all --shm-size=8g {REF}"
    assert any("--ipc=host" in c for c in cuda) and cuda[-1].endswith("torch-smoke --require-gpu")
    assert all("--gpus" not in c for _, c in howto.run_commands(CPU, REF))
    config = {"user": "1000:1000"}
    pod = yaml.safe_load(howto.pod_manifest(CUDA, REF, config))
    [container] = pod["spec"]["containers"]
    assert container["image"] == REF and container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["spec"]["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    root = yaml.safe_load(howto.pod_manifest(CPU, REF, {"user": "0:0"}))
    assert root["spec"]["securityContext"]["runAsUser"] == 1000  # restricted: never root
    assert "nvidia.com/gpu" not in root["spec"]["containers"][0]["resources"]["limits"]


def test_the_specifications_come_from_the_config_and_the_sbom() -> None:
    config = catalog_doc.run_config(RUN_CONFIG)
    platform = {"config": config, "evidence": {"sbom": {"present": True, "shells": ["dash 0.5"]}}}
    specs = dict(howto.specifications(CPU, platform))
    assert specs["user"] == "1000:1000 (uid 1000, not root)"
    assert specs["command"] == "python" and specs["entrypoint"] == "none"
    assert specs["working folder"] == "/home/user" and specs["shell"].startswith("yes: dash")
    assert specs["python"] == "python 3.11: `python` is /opt/venv/bin/python, first on PATH"
    assert "VIRTUAL_ENV=/opt/venv" in specs["environment"]
    platform["evidence"]["sbom"]["shells"] = []
    assert dict(howto.specifications(CPU, platform))["shell"] == "none in the SBOM"


def test_the_verify_commands_are_the_ones_that_check_a_key_signature_offline() -> None:
    sig = {"present": True, "attestations": ["https://cyclonedx.org/bom"], "keyless": True}
    commands = [c for _, c in howto.verify_commands(REF, sig, "cosign.pub",
                                                    "https://github.com/o/torch-images")]
    assert commands[0] == f"builder verify --key cosign.pub {REF}"
    assert commands[1] == f"cosign verify --key cosign.pub --insecure-ignore-tlog=true {REF}"
    assert shlex.split(commands[2])[:2] == ["cosign", "verify-attestation"]
    assert "--type https://cyclonedx.org/bom" in commands[2]
    assert "--certificate-identity https://github.com/o/torch-images/.github/workflows/" \
        "build.yml@refs/heads/main" in commands[3]
    unsigned = howto.verify_commands(REF, {"present": False}, "cosign.pub", None)
    assert [c for _, c in unsigned] == [f"builder verify --key cosign.pub {REF}"]


def test_an_identity_signed_image_gets_commands_that_pin_its_signer() -> None:
    who = {"subject": "https://github.com/o/torch-images/.github/workflows/build.yml@refs/heads/"
                      "main", "issuer": "https://token.actions.githubusercontent.com"}
    rows = howto.verify_commands(REF, {"present": False, "identities": [who]}, "cosign.pub", None)
    pinned = (f"--certificate-identity {who['subject']} --certificate-oidc-issuer "
              f"{who['issuer']}")
    assert rows[1] == (f"signed keylessly by {who['subject']} (not an identity given as "
                       "trusted; builder)", f"builder verify {pinned} {REF}")
    assert rows[2][1] == f"cosign verify {pinned} {REF}"
    assert rows[3][1] == (f"gh attestation verify oci://{REF} --bundle-from-oci --repo "
                          f"o/torch-images --cert-identity {who['subject']} --cert-oidc-issuer "
                          f"{who['issuer']}")
    rows = howto.verify_commands(REF, {"identities": [{**who, "trusted": True}]}, "k", None)
    assert rows[1][0] == f"signed keylessly by {who['subject']} (a trusted identity; builder)"
    person = {"subject": "someone@example.com", "issuer": "https://accounts.google.com"}
    rows = howto.verify_commands(REF, {"present": False, "identities": [person]}, "k", None)
    assert len(rows) == 3  # no GitHub repository to name: no gh command


def test_the_latest_audit_and_the_history_give_one_answer() -> None:
    inconclusive = {"audit": {"present": True, "vulnerabilities": 0,
                              "incomplete": ["debian-security"], "date": "2026-12-04"}}
    state = catalog_doc.audit_state(inconclusive)
    assert state["state"] == "inconclusive" and catalog_doc.vulnerabilities(inconclusive) is None
    assert catalog_doc.audit_state({})["state"] == "not audited"
    sbom = {"sbom": {"present": True, "vulnerabilities": 3}}
    assert (catalog_doc.audit_state(sbom)["state"], catalog_doc.vulnerabilities(sbom)) == ("vulnerable", 3)


def test_every_report_counts_the_same_components_nested_ones_included() -> None:
    doc = {"components": [{"name": "torch", "purl": "pkg:pypi/torch@2",
                           "components": [{"name": "libgomp", "purl": "pkg:generic/libgomp@1"}]},
                          {"name": "dash", "purl": "pkg:deb/debian/dash@0.5"}]}
    counts, found = component_counts(doc)
    assert counts == {"deb": 1, "generic": 1, "pypi": 1} and len(found) == 3
    assert count_line(counts) == "3 components (1 deb, 1 generic, 1 pypi)"
