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

from builder.core import keyless, sign
from builder.model import matrix, smokereport
from builder.stages import provenance

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "admission"
IMAGE = matrix.load(ROOT / "matrix.yaml").image_name  # REGISTRY/REPOSITORY
STAGING = IMAGE + "-staging"
WORKFLOWS = ROOT / ".github" / "workflows"
# The placeholder every example names the publishing GitHub repository by (README: "Admission")
OWNER_REPO = "YOUR-ORG/torch-images"
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


# ---- who the workflows sign as ----------------------------------------------------------------


def signing_workflows() -> list[str]:
    """The workflow files with a job that gets an OIDC token to sign with: `id-token: write` on
    a job of its own steps (a reusable-workflow call signs as the called file; deploy-pages
    proves a Pages deployment, it signs no image)."""
    found = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        jobs = (yaml.safe_load(path.read_text()) or {}).get("jobs") or {}
        if any((job.get("permissions") or {}).get("id-token") == "write" and "steps" in job
               and not any("actions/deploy-pages" in str(step.get("uses", ""))
                           for step in job["steps"])
               for job in jobs.values()):
            found.append(path.name)
    return found


def subject(workflow: str, ref: str = "refs/heads/main", repo: str = OWNER_REPO) -> str:
    """A Fulcio certificate's subject for a GitHub workflow run (its job_workflow_ref)."""
    return f"https://github.com/{repo}/.github/workflows/{workflow}@{ref}"


def identity_matches(entry: dict[str, Any], name: str) -> bool:
    """Kyverno's and policy-controller's identity match: `subject` exact, `subjectRegExp` Go's
    regexp.MatchString (unanchored: the pattern's own `^…$` makes it whole)."""
    if entry.get("subject"):
        return entry["subject"] == name
    return re.search(entry["subjectRegExp"], name) is not None


def keyless_problems(entry: dict[str, Any]) -> list[str]:
    """One keyless identity (Kyverno's `keyless`, a policy-controller identity) must be GitHub's
    issuer, match every signing workflow of the placeholder repository on main, and nothing
    near it: a pull-request ref, another branch or tag, another workflow, another repository."""
    signers = signing_workflows()
    problems = [] if entry.get("issuer") == keyless.GITHUB_ISSUER else [
        f"issuer {entry.get('issuer')}"]
    problems += [f"{subject(w)} is not matched" for w in signers
                 if not identity_matches(entry, subject(w))]
    near = [subject(w, ref) for w in signers for ref in
            ("refs/pull/7/merge", "refs/heads/main-next", "refs/heads/feature", "refs/tags/v1")]
    near += [subject(w, repo=repo) for w in signers for repo in
             ("OTHER-ORG/torch-images", f"{OWNER_REPO}-fork", "YOUR-ORG/torch")]
    near += [subject(w.name) for w in sorted(WORKFLOWS.glob("*.yml")) if w.name not in signers]
    near += [subject(signers[0]) + "-evil", "evil/" + subject(signers[0])]
    return problems + [f"{name} is matched" for name in near if identity_matches(entry, name)]


def keyless_entries() -> dict[str, dict[str, Any]]:
    """Where each example names a keyless identity → that identity (issuer, subject[RegExp])."""
    check = load("kyverno-clusterpolicy.yaml")["spec"]["rules"][0]["verifyImages"][0]
    found = {f"kyverno {where}": e["keyless"]
             for where, attestors in [("image", check["attestors"]), *(
                 (a["type"], a["attestors"]) for a in check["attestations"])]
             for a in attestors for e in a["entries"] if "keyless" in e}
    vetted = load("policy-controller-clusterimagepolicy.yaml")[0]
    found |= {f"policy-controller {a['name']} {n}": identity
              for a in vetted["spec"]["authorities"] if "keyless" in a
              for n, identity in enumerate(a["keyless"]["identities"])}
    return found


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
    assert keyless_problems(entries[1]["keyless"]) == []
    assert entries[1]["keyless"]["rekor"] == {"url": "https://rekor.sigstore.dev"}
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
    key, workflow = docs[0]["spec"]["authorities"]
    assert "BEGIN PUBLIC KEY" in key["key"]["data"] and "ctlog" not in key
    assert workflow["keyless"]["url"] == "https://fulcio.sigstore.dev"
    assert workflow["ctlog"] == {"url": "https://rekor.sigstore.dev"}
    [identity] = workflow["keyless"]["identities"]
    assert keyless_problems(identity) == []
    for authority in (key, workflow):
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


def test_keyless_entries_name_the_identities_the_workflows_sign_with() -> None:
    assert signing_workflows() == ["build.yml", "rebuild.yml"]  # catalog.yml: Pages only
    entries = keyless_entries()
    assert len(entries) == 1 + len(sign.PREDICATES) + 1  # Kyverno's image + attestations, p-c
    assert {where: problems for where, e in entries.items()
            if (problems := keyless_problems(e))} == {}
    for entry in entries.values():  # the placeholder is what a platform team replaces
        mine = {k: v.replace(OWNER_REPO, "acme/torch-images") for k, v in entry.items()
                if isinstance(v, str)}
        assert identity_matches(mine, subject("rebuild.yml", repo="acme/torch-images"))
    readme = (ROOT / "README.md").read_text()  # what it tells a platform team to replace
    assert {f"`{e['subjectRegExp']}`" in readme for e in entries.values()} == {True}


def test_keyless_checks_catch_a_loose_identity() -> None:
    [entry] = [e for w, e in keyless_entries().items() if w == "kyverno image"]
    regexp = entry["subjectRegExp"]
    unanchored = {**entry, "subjectRegExp": regexp.strip("^$")}
    assert set(keyless_problems(unanchored)) >= {
        f"{subject('build.yml')}-evil is matched",
        f"{subject('build.yml', 'refs/heads/main-next')} is matched"}
    build_only = {**entry, "subjectRegExp": regexp.replace("(build|rebuild)", "build")}
    assert keyless_problems(build_only) == [f"{subject('rebuild.yml')} is not matched"]
    any_ref = {**entry, "subjectRegExp": regexp.replace("refs/heads/main", ".*")}
    assert f"{subject('build.yml', 'refs/pull/7/merge')} is matched" in keyless_problems(any_ref)
    any_repo = {**entry, "subjectRegExp": regexp.replace(OWNER_REPO, "[^/]+/[^/]+")}
    assert f"{subject('build.yml', repo='OTHER-ORG/torch-images')} is matched" in \
        keyless_problems(any_repo)
    assert keyless_problems({**entry, "issuer": "https://gitlab.com"}) == [
        "issuer https://gitlab.com"]
    exact = {"issuer": keyless.GITHUB_ISSUER, "subject": subject("build.yml")}
    assert keyless_problems(exact) == [f"{subject('rebuild.yml')} is not matched"]


def test_containers_policy_has_no_keyless_requirement_it_could_not_express() -> None:
    """containers-policy.json's `fulcio` takes `subjectEmail` alone: a workflow's URI subject
    cannot be required there, and the example says so instead of trusting any certificate."""
    policy = load("containers-policy.json")
    assert all("fulcio" not in r for rs in policy["transports"]["docker"].values() for r in rs)
    note = (EXAMPLES / "registries.d-torch-images.yaml").read_text()
    assert "subjectEmail" in note and "URI SAN" in note
