"""examples/admission: the Kyverno, policy-controller and containers-policy.json rules a platform
team installs. They must name what the pipeline writes (the vetted repository of matrix.yaml,
cosign's signature, the predicate types of builder.core.sign) and, read with each tool's own
matching rules, take every reference of the vetted repository and never one of `-staging`, and
check every attestation against the same key as the image. Each check is a function returning
problems, so the tests can also plant the mistakes (a `torch*` pattern, an attestation without
attestors) and see them caught."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from builder.core import sign
from builder.model import matrix, smokereport
from builder.stages import provenance

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "admission"
IMAGE = matrix.load(ROOT / "matrix.yaml").image_name  # REGISTRY/REPOSITORY
STAGING = IMAGE + "-staging"
WORKFLOW_SUBJECT = "https://github.com/YOUR-ORG/torch-images/.github/workflows/build.yml@refs/heads/main"
TAG, DIGEST = "2.13.0-py3.11-cpu-runtime", "sha256:" + "a" * 64
VETTED = [f"{IMAGE}:{TAG}", f"{IMAGE}@{DIGEST}", f"{IMAGE}:{TAG}@{DIGEST}",
          f"{IMAGE}:{TAG}-20261204", f"{IMAGE}:build-0123456789abcdef0123"]
STAGED = [f"{STAGING}:{TAG}", f"{STAGING}@{DIGEST}", f"{STAGING}:build-0123456789abcdef0123",
          f"{STAGING}:{TAG}@{DIGEST}"]

NESTED = [f"{IMAGE}/nested@{DIGEST}", f"{IMAGE}/nested:{TAG}"]  # another repository
# repositories whose names start like the vetted one's: never admitted as vetted
NEAR_MISS = [f"{IMAGE}{suffix}{ref}" for suffix in ("-base", "serve", "-staging")
             for ref in (f":{TAG}", f"@{DIGEST}", f":{TAG}@{DIGEST}")]


def load(name: str) -> Any:
    text = (EXAMPLES / name).read_text()
    if name.endswith(".json"):
        return json.loads(text)
    docs = list(yaml.safe_load_all(text))
    return docs[0] if len(docs) == 1 else docs


# ---- each tool's matching rules ---------------------------------------------------------------


def kyverno_match(pattern: str, image: str) -> bool:
    """Kyverno's wildcard (ext/wildcard → IGLOU-EU/go-wildcard v2): `*` any run of characters,
    `/` and `:` included; `?` and `.` one character; the rest literal; the whole string."""
    regex = "".join(".*" if c == "*" else "." if c in "?." else re.escape(c) for c in pattern)
    return re.fullmatch(regex, image) is not None


def policy_controller_name(image: str) -> str:
    """go-containerregistry's Name() of what policy-controller matches: `repo@digest` for a
    digest reference (its tag dropped), `repo:tag` otherwise."""
    name, at, digest = image.partition("@")
    if at:
        repo = name.rsplit(":", 1)[0] if ":" in name.split("/")[-1] else name
        return f"{repo}@{digest}"
    return image


def policy_controller_match(glob: str, image: str) -> bool:
    """policy-controller's pkg/apis/glob: only `[a-zA-Z0-9-_:/*.@]`; `**` any run, `*` any run
    without `/`, `.` literal; the whole name."""
    assert re.fullmatch(r"[a-zA-Z0-9\-_:/*.@]+", glob), f"invalid glob {glob!r}"
    regex = re.escape(glob).replace(r"\*\*", "#").replace(r"\*", "[^/]*").replace("#", ".*")
    return re.fullmatch(regex, policy_controller_name(image)) is not None


def containers_scope(policy: dict[str, Any], image: str) -> str | None:
    """containers-policy.json(5): the most specific `transports.docker` scope naming `image`
    — the reference itself, its repository, then each parent namespace, then the host — else
    None (the node's own defaults apply)."""
    scopes = policy.get("transports", {}).get("docker", {})
    name = image.partition("@")[0]
    repo = name.rsplit(":", 1)[0] if ":" in name.split("/")[-1] else name
    candidates = [image, repo]
    while "/" in candidates[-1]:
        candidates.append(candidates[-1].rsplit("/", 1)[0])
    return next((c for c in candidates if c in scopes), None)


# ---- what each file must say ------------------------------------------------------------------


def kyverno_problems(policy: dict[str, Any]) -> list[str]:
    rules = {r["name"]: r for r in policy["spec"]["rules"]}
    [check] = rules["signed-and-attested"]["verifyImages"]
    refs, skip = check["imageReferences"], check.get("skipImageReferences") or []
    problems = [f"{ref} is not verified" for ref in VETTED
                if not any(kyverno_match(p, ref) for p in refs)
                or any(kyverno_match(p, ref) for p in skip)]
    problems += [f"{ref} is matched by {p}" for ref in STAGED for p in refs
                 if kyverno_match(p, ref)]
    problems += [f"{ref} is matched by {p}" for ref in (*NESTED, *NEAR_MISS) for p in refs
                 if kyverno_match(p, ref)]
    problems += [f"{ref} is not skipped" for ref in STAGED
                 if not any(kyverno_match(p, ref) for p in skip)]
    denied = rules["no-staging-images"]["validate"]["pattern"]["spec"]["containers"][0]["image"]
    assert denied.startswith("!")
    problems += [f"{ref} is not refused" for ref in STAGED if not kyverno_match(denied[1:], ref)]
    problems += [f"{ref} is refused" for ref in VETTED if kyverno_match(denied[1:], ref)]
    want = _attestor_keys(check.get("attestors"))
    for att in check["attestations"]:
        if not att.get("attestors"):
            problems.append(f"attestation {att['type']} names no attestors")
        elif _attestor_keys(att["attestors"]) != want:
            problems.append(f"attestation {att['type']} has other attestors than the image")
    return problems


def _attestor_keys(attestors: list[dict[str, Any]] | None) -> list[Any]:
    return [(e.get("keys", {}).get("publicKeys"), (e.get("keyless") or {}).get("subjectRegExp"))
            for a in attestors or [] for e in a["entries"]]


def policy_controller_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Every policy whose glob matches must pass: a vetted reference meets only the vetted
    policy, a staging reference meets one that always fails."""
    def matching(ref: str) -> list[dict[str, Any]]:
        return [d for d in docs if any(policy_controller_match(i["glob"], ref)
                                       for i in d["spec"]["images"])]

    vetted = next(d for d in docs if d["metadata"]["name"] == "torch-images-vetted")
    problems = [f"{ref} meets {[d['metadata']['name'] for d in matching(ref)]}"
                for ref in VETTED if matching(ref) != [vetted]]
    problems += [f"{ref} meets the vetted policy" for ref in (*NESTED, *NEAR_MISS)
                 if vetted in matching(ref)]
    problems += [f"{ref} can be admitted" for ref in STAGED if not any(
        all((a.get("static") or {}).get("action") == "fail" for a in d["spec"]["authorities"])
        for d in matching(ref))]
    for authority in vetted["spec"]["authorities"]:
        types = {a["predicateType"] for a in authority.get("attestations") or []}
        if types != set(sign.PREDICATES.values()):
            problems.append(f"authority {authority['name']} checks attestations {sorted(types)}")
    return problems


def containers_problems(policy: dict[str, Any]) -> list[str]:
    problems = [f"{ref}: scope {containers_scope(policy, ref)}" for ref in VETTED
                if containers_scope(policy, ref) != IMAGE]
    problems += [f"{ref} meets scope {IMAGE}" for ref in NEAR_MISS
                 if containers_scope(policy, ref) == IMAGE]
    problems += [f"{ref} meets scope {s}" for ref in STAGED  # a repository scope is also a
                 if (s := containers_scope(policy, ref)) is not None]  # namespace: NESTED match
    if set(policy) != {"transports"} or set(policy["transports"]) != {"docker"}:
        problems.append("not a transports.docker fragment: merging it would change the node's "
                        f"defaults ({sorted(policy)})")
    return problems


# ---- the tests --------------------------------------------------------------------------------


def test_kyverno_requires_the_signature_and_every_attestation_by_the_same_attestors() -> None:
    policy = load("kyverno-clusterpolicy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == ("kyverno.io/v1", "ClusterPolicy")
    assert "validationFailureAction" not in policy["spec"]  # deprecated: per rule instead
    assert [r.get("validate", r.get("verifyImages", [{}])[0]).get("failureAction")
            for r in policy["spec"]["rules"]] == ["Enforce", "Enforce"]
    assert kyverno_problems(policy) == []
    [check] = policy["spec"]["rules"][0]["verifyImages"]
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
    assert "status" in smokereport.schema()["required"]
    build_type = types[sign.PREDICATES["provenance"]]["conditions"][0]["all"][0]["value"]
    assert build_type == provenance.BUILD_TYPE


def test_kyverno_checks_catch_a_staging_wide_pattern_and_an_attestation_without_attestors(
        ) -> None:
    policy = load("kyverno-clusterpolicy.yaml")
    wide = copy.deepcopy(policy)
    wide["spec"]["rules"][0]["verifyImages"][0]["imageReferences"] = [f"{IMAGE}*"]
    assert f"{STAGING}:{TAG} is matched by {IMAGE}*" in kyverno_problems(wide)
    assert {f"{IMAGE}-base:{TAG} is matched by {IMAGE}*",
            f"{IMAGE}serve@{DIGEST} is matched by {IMAGE}*"} <= set(kyverno_problems(wide))
    bare = copy.deepcopy(policy)
    del bare["spec"]["rules"][0]["verifyImages"][0]["attestations"][1]["attestors"]
    assert kyverno_problems(bare) == [f"attestation {sign.PREDICATES['sbom']} names no attestors"]
    other = copy.deepcopy(policy)
    att = other["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]
    att["attestors"] = [{"entries": [{"keys": {"publicKeys": "another key"}}]}]
    assert kyverno_problems(other) == [
        f"attestation {sign.PREDICATES['smoke']} has other attestors than the image"]
    assert kyverno_match("127.0.0.1:5000/torch*", "127.0.0.1:5000/torch-staging:x")  # the rule


def test_policy_controller_admits_the_vetted_repository_only() -> None:
    docs = load("policy-controller-clusterimagepolicy.yaml")
    assert all((d["apiVersion"], d["kind"]) == ("policy.sigstore.dev/v1beta1",
                                                "ClusterImagePolicy") for d in docs)
    assert policy_controller_problems(docs) == []
    key, keyless = docs[0]["spec"]["authorities"]
    assert "BEGIN PUBLIC KEY" in key["key"]["data"] and "ctlog" not in key
    [identity] = keyless["keyless"]["identities"]
    assert re.fullmatch(identity["subjectRegExp"], WORKFLOW_SUBJECT)
    for authority in (key, keyless):
        smoke = [a for a in authority["attestations"]
                 if a["predicateType"] == sign.PREDICATES["smoke"]]
        assert 'predicate: status: "pass"' in smoke[0]["policy"]["data"]
    # planted: without the staging refusal, `torch*` takes staging digests; a `torch**` glob
    # takes nested repositories too; an authority that skips the SBOM
    assert f"{STAGING}@{DIGEST} can be admitted" in policy_controller_problems(docs[:1])
    nested = copy.deepcopy(docs)
    nested[0]["spec"]["images"] = [{"glob": f"{IMAGE}**"}]
    assert policy_controller_problems(nested) == [f"{ref} meets the vetted policy"
                                                  for ref in (*NESTED, *NEAR_MISS)]
    prefix = copy.deepcopy(docs)
    prefix[0]["spec"]["images"] = [{"glob": f"{IMAGE}*"}]  # the old example's glob
    assert {f"{IMAGE}-base:{TAG} meets the vetted policy",
            f"{IMAGE}serve@{DIGEST} meets the vetted policy"} <= set(
        policy_controller_problems(prefix))
    lax = copy.deepcopy(docs)
    del lax[0]["spec"]["authorities"][1]["attestations"][1]
    assert any("publish-workflow checks" in p for p in policy_controller_problems(lax))


def test_containers_policy_is_a_docker_scope_for_the_vetted_repository_only() -> None:
    policy = load("containers-policy.json")
    assert containers_problems(policy) == []
    [requirement] = policy["transports"]["docker"][IMAGE]
    assert requirement["type"] == "sigstoreSigned"
    assert requirement["signedIdentity"] == {"type": "matchRepository"}
    assert requirement["keyPath"].endswith(".pub")
    registries = load("registries.d-torch-images.yaml")
    assert registries["docker"][IMAGE]["use-sigstore-attachments"] is True
    # planted: a registry-wide scope, and a full policy that would replace the node's default
    wide = {"transports": {"docker": {IMAGE.split("/")[0]: [requirement]}}}
    assert f"{STAGING}:{TAG} meets scope {IMAGE.split('/')[0]}" in containers_problems(wide)
    full = {"default": [{"type": "reject"}], **policy}
    assert containers_problems(full)[-1].startswith("not a transports.docker fragment")
    merged = {"default": [{"type": "insecureAcceptAnything"}],
              "transports": {"docker": {"registry.k8s.io": [{"type": "insecureAcceptAnything"}]}}}
    merged["transports"]["docker"] |= policy["transports"]["docker"]  # README's jq merge
    assert containers_scope(merged, "registry.k8s.io/pause:3.9") == "registry.k8s.io"
    assert containers_scope(merged, f"{IMAGE}:{TAG}") == IMAGE
