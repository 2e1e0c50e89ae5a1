"""examples/admission: the Kyverno, policy-controller and containers-policy.json rules a platform
team installs. They must name what the pipeline writes: the vetted repository of matrix.yaml,
cosign's signature, and the predicate types of builder.core.sign (the smoke report's `status`,
the provenance's build type)."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import yaml

from builder.core import sign
from builder.model import matrix
from builder.stages import provenance, smoketest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "admission"
IMAGE = matrix.load(ROOT / "matrix.yaml").image_name  # REGISTRY/REPOSITORY
WORKFLOW_SUBJECT = "https://github.com/YOUR-ORG/torch-images/.github/workflows/build.yml@refs/heads/main"


def load(name: str) -> dict:
    text = (EXAMPLES / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def test_kyverno_requires_the_signature_and_every_attestation() -> None:
    policy = load("kyverno-clusterpolicy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == ("kyverno.io/v1", "ClusterPolicy")
    assert policy["spec"]["validationFailureAction"] == "Enforce"
    [rule] = policy["spec"]["rules"]
    [check] = rule["verifyImages"]
    assert any(fnmatch.fnmatch(f"{IMAGE}:2.13.0-py3.11-cpu-runtime", ref)
               for ref in check["imageReferences"])
    assert check["required"] and check["verifyDigest"] and check["mutateDigest"]
    entries = check["attestors"][0]["entries"]
    assert "BEGIN PUBLIC KEY" in entries[0]["keys"]["publicKeys"]
    keyless = entries[1]["keyless"]
    assert keyless["issuer"] == "https://token.actions.githubusercontent.com"
    assert re.fullmatch(keyless["subjectRegExp"], WORKFLOW_SUBJECT)
    types = {a["type"]: a for a in check["attestations"]}
    assert set(types) == set(sign.PREDICATES.values())
    smoke = types[sign.PREDICATES["smoke"]]["conditions"][0]["all"][0]
    assert (smoke["key"], smoke["value"]) == ("{{ status }}", "pass")
    assert "status" in smoketest.schema()["required"]
    build_type = types[sign.PREDICATES["provenance"]]["conditions"][0]["all"][0]["value"]
    assert build_type == provenance.BUILD_TYPE


def test_policy_controller_requires_the_key_or_the_workflow_and_the_attestations() -> None:
    policy = load("policy-controller-clusterimagepolicy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == ("policy.sigstore.dev/v1beta1",
                                                      "ClusterImagePolicy")
    assert any(fnmatch.fnmatch(f"{IMAGE}@sha256:{'a' * 64}", g["glob"].replace("**", "*"))
               for g in policy["spec"]["images"])
    key, keyless = policy["spec"]["authorities"]
    assert "BEGIN PUBLIC KEY" in key["key"]["data"]
    assert {a["predicateType"] for a in key["attestations"]} == set(sign.PREDICATES.values())
    [identity] = keyless["keyless"]["identities"]
    assert re.fullmatch(identity["subjectRegExp"], WORKFLOW_SUBJECT)
    for authority in (key, keyless):
        smoke = [a for a in authority["attestations"]
                 if a["predicateType"] == sign.PREDICATES["smoke"]]
        assert 'predicate: status: "pass"' in smoke[0]["policy"]["data"]


def test_containers_policy_requires_a_sigstore_signature_of_the_repository() -> None:
    policy = load("containers-policy.json")
    assert policy["default"] == [{"type": "reject"}]
    [requirement] = policy["transports"]["docker"][IMAGE]
    assert requirement["type"] == "sigstoreSigned"
    assert requirement["signedIdentity"] == {"type": "matchRepository"}
    assert requirement["keyPath"].endswith(".pub")
    registries = load("registries.d-torch-images.yaml")
    assert registries["docker"][IMAGE]["use-sigstore-attachments"] is True
