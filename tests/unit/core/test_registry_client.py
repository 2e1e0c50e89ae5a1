"""The registry client against fake registries on loopback ports that misbehave: credentials
stay where they belong, deadlines and size caps hold, every malformed answer is one line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest
from fakeregistry import Request, Server, Store, basic, digest, serving

from builder import cli
from builder.commands.options import resolve
from builder.core import oci, oci_blobs, registry_auth, registry_http, settings
from builder.core.oci import RegistryError
from builder.flows import verify
from builder.stages import plan

FAST = (0.0, 0.0, 0.0)
IMAGE_CONFIG = json.dumps({"config": {"Labels": {"a": "b"}}}).encode()


def reg(server: Server, **kw: float) -> oci.Registry:
    return oci.Registry(server.addr, backoff=FAST, **kw)  # type: ignore[arg-type]


def one_line(exc: pytest.ExceptionInfo[RegistryError], *parts: str) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, text
    return text


def image(store: Store, layer: bytes = b"layer") -> str:
    config = store.add_blob(IMAGE_CONFIG)
    blob = store.add_blob(layer)
    return store.add_manifest({
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
        "config": {"mediaType": oci.OCI_CONFIG, "digest": config, "size": len(IMAGE_CONFIG)},
        "layers": [{"mediaType": oci.OCI_LAYER_GZIP, "digest": blob, "size": len(layer)}]},
        "t")


def with_creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_USERNAME", "alice")
    monkeypatch.setenv("REGISTRY_PASSWORD", "s3cret")


def basic_gate(server: Server, store: Store) -> None:
    """Every request but the ping wants Basic alice:s3cret."""
    def gate(r: Request) -> bool:
        if r.headers.get("Authorization") == basic("alice", "s3cret"):
            return True
        r.reply(401, b"{}", {"WWW-Authenticate": 'Basic realm="fake"'})
        return False
    server.gate = gate
    store.serve(server)


# ---- credentials --------------------------------------------------------------------------------


def test_no_credentials_before_a_challenge(fake: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    with_creds(monkeypatch)
    fake.ping_ok()  # the ping does not challenge: the first manifest request must go bare
    store = Store()
    ref = image(store)
    basic_gate(fake, store)
    assert reg(fake).manifest("repo", ref) is not None
    first = next(s for s in fake.seen if "/manifests/" in s.path)
    assert "Authorization" not in first.headers
    assert all("Authorization" not in s.headers for s in fake.seen if s.path == "/v2/")
    assert fake.seen[-1].headers["Authorization"] == basic("alice", "s3cret")


def test_a_redirect_to_another_host_drops_credentials(fake: Server,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with_creds(monkeypatch)
    fake.route("GET", "/v2/")(lambda r, m: r.reply(401, b"", {
        "WWW-Authenticate": 'Basic realm="fake"'}))
    data = b"layer bytes"
    with serving() as blobstore:
        blobstore.route("GET", "/blob")(lambda r, m: r.reply(200, data))
        other = f"http://localhost:{blobstore.server_address[1]}/blob"
        fake.route("GET", r"/v2/repo/blobs/.*")(
            lambda r, m: r.reply(307, b"", {"Location": other}))
        assert reg(fake).blob("repo", digest(data)) == data
        assert blobstore.seen and "Authorization" not in blobstore.seen[0].headers
    assert fake.seen[-1].headers["Authorization"] == basic("alice", "s3cret")


def test_a_realm_on_another_host_gets_no_credentials(fake: Server,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with_creds(monkeypatch)
    store = Store()
    ref = image(store)
    with serving() as auth:
        auth.route("GET", r"/token\?.*")(lambda r, m: r.reply(
            200, json.dumps({"token": "T", "expires_in": 300}).encode()))
        realm = f"http://localhost:{auth.server_address[1]}/token"

        def gate(r: Request) -> bool:
            if r.headers.get("Authorization") == "Bearer T":
                return True
            r.reply(401, b"", {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'})
            return False
        fake.ping_ok()
        fake.gate = gate
        store.serve(fake)
        assert reg(fake).manifest("repo", ref) is not None
        assert auth.seen and all("Authorization" not in s.headers for s in auth.seen)
        assert "scope=repository%3Arepo%3Apull" in auth.seen[0].path


def test_credentials_never_over_plain_http_to_another_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with_creds(monkeypatch)
    session = registry_http.Session("registry.example:5000", scheme="http",
                                    challenge=("basic", {}))
    with pytest.raises(RegistryError, match="plain HTTP"):
        session.authorization((), registry_http.Deadline(5), 5)
    session.challenge = ("bearer", {"realm": "https://registry.example/token"})
    with pytest.raises(RegistryError, match="plain HTTP"):  # a token got with them neither
        session.authorization((), registry_http.Deadline(5), 5)


def test_bearer_scopes_for_a_cross_repository_mount_and_token_refresh(
        fake: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    with_creds(monkeypatch)
    issued: list[str] = []

    def token(r: Request, m: re.Match[str]) -> None:
        issued.append(r.path)
        assert r.headers.get("Authorization") == basic("alice", "s3cret")  # same host: ours
        r.reply(200, json.dumps({"token": f"T{len(issued)}", "expires_in": 300}).encode())
    fake.route("GET", r"/token\?.*")(token)
    realm = f"http://{fake.addr}/token"

    def challenged(r: Request, m: re.Match[str]) -> None:
        if not (r.headers.get("Authorization") or "").startswith("Bearer T"):
            r.reply(401, b"", {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'})
        elif "mount=" in r.path:
            r.reply(201, b"", {"Location": "/v2/dst/blobs/x"})
        else:
            r.reply(404)
    fake.route("GET", "/v2/")(challenged)
    fake.route("HEAD", r"/v2/.*")(challenged)
    fake.route("POST", r"/v2/.*")(challenged)
    blob = "sha256:" + "a" * 64
    reg(fake).mount_blob("dst", blob, "src")
    mount_token = next(p for p in issued if "src" in p)
    assert "scope=repository%3Adst%3Apull%2Cpush" in mount_token
    assert "scope=repository%3Asrc%3Apull" in mount_token
    session = registry_http.session(fake.addr)
    for t in session.tokens.values():
        t.expires = 0  # expired: the next request fetches a fresh one
    before = len(issued)
    reg(fake).has_blob("dst", blob)
    assert len(issued) == before + 1


def test_docker_config_auths_and_helpers_in_dockers_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REGISTRY_USERNAME", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    auth = json.dumps({"auths": {
        "https://r.example:5000/v1/": {"auth": "Ym9iOnB3"},  # bob:pw
        "https://index.docker.io/v1/": {"identitytoken": "refresh"}},
        "credHelpers": {"ghcr.io": "fake"}}).encode()
    (tmp_path / "config.json").write_bytes(auth)
    called: list[tuple[str, str]] = []

    def helper(name: str, registry: str) -> registry_auth.Credentials:
        called.append((name, registry))
        return registry_auth.Credentials("carol", "pat", "docker-credential-" + name)
    monkeypatch.setattr(registry_auth, "helper_get", helper)
    found = registry_auth.lookup("r.example:5000")
    assert (found.username, found.secret) == ("bob", "pw")  # type: ignore[union-attr]
    assert registry_auth.lookup("registry-1.docker.io").identity_token  # type: ignore[union-attr]
    assert registry_auth.lookup("ghcr.io").username == "carol"  # type: ignore[union-attr]
    assert called == [("fake", "ghcr.io")]
    assert registry_auth.lookup("other.example") is None
    monkeypatch.setenv("REGISTRY_USERNAME", "env")
    monkeypatch.setenv("REGISTRY_PASSWORD", "pw")
    assert registry_auth.lookup("ghcr.io").username == "env"  # type: ignore[union-attr]
    (tmp_path / "config.json").write_text("{not json")
    monkeypatch.delenv("REGISTRY_USERNAME")
    with pytest.raises(registry_auth.CredentialsError, match=r"config\.json"):
        registry_auth.lookup("ghcr.io")


def test_insecure_registries_follow_dockers_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILDER_INSECURE_REGISTRIES", "lab.example:5000,10.1.0.0/16")
    assert registry_http.is_insecure("127.0.0.5:5000")
    assert registry_http.is_insecure("localhost:5000")
    assert registry_http.is_insecure("lab.example:5000")
    assert registry_http.is_insecure("10.1.2.3:443")
    assert not registry_http.is_insecure("ghcr.io")
    assert not registry_http.is_insecure("10.2.0.1")
    assert registry_http.same_domain("registry-1.docker.io", "auth.docker.io")
    assert not registry_http.same_domain("ghcr.io", "evil.io.example")
    assert not registry_http.same_domain("127.0.0.1", "localhost")


def test_https_first_then_plain_http_on_loopback(fake: Server) -> None:
    store = Store()
    ref = image(store)
    fake.ping_ok()
    store.serve(fake)
    r = reg(fake)
    assert r.head("repo", "t").digest == ref  # type: ignore[union-attr]
    assert r.session.scheme == "http"  # the TLS attempt failed first


# ---- bounds -------------------------------------------------------------------------------------


def drip(r: Request, byte: bytes, times: int) -> None:
    """One byte every 0.1 s until the client hangs up: no read waits long, the whole does."""
    for _ in range(times):
        try:
            r.wfile.write(byte)
            r.wfile.flush()
        except OSError:
            return
        time.sleep(0.1)


def trickle(r: Request, m: re.Match[str]) -> None:
    r.send_response(200)
    r.send_header("Content-Type", oci.OCI_MANIFEST)
    r.send_header("Content-Length", "1000")
    r.end_headers()
    drip(r, b" ", 1000)


def trickle_headers(r: Request, m: re.Match[str]) -> None:
    r.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    drip(r, b"a", 100)


def test_a_trickling_server_ends_within_the_deadline(fake: Server) -> None:
    fake.ping_ok()
    fake.route("GET", r"/v2/repo/manifests/.*")(trickle)
    start = time.monotonic()
    with pytest.raises(RegistryError) as exc:
        reg(fake, deadline=1.0).manifest("repo", "t")
    assert time.monotonic() - start < 3
    one_line(exc, fake.addr, "GET", "/v2/repo/manifests/t", "1 s deadline")


def test_trickling_headers_end_within_the_deadline(fake: Server) -> None:
    fake.ping_ok()
    fake.route("GET", r"/v2/repo/manifests/.*")(trickle_headers)
    start = time.monotonic()
    with pytest.raises(RegistryError):
        reg(fake, deadline=1.0).manifest("repo", "t")
    assert time.monotonic() - start < 3


def test_an_oversized_manifest_is_refused_after_its_cap(fake: Server,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fake.ping_ok()
    sent = []

    def endless(r: Request, m: re.Match[str]) -> None:
        r.send_response(200)
        r.send_header("Content-Type", oci.OCI_MANIFEST)
        r.send_header("Connection", "close")
        r.end_headers()
        chunk = b"[" * 65536
        try:
            for _ in range(1600):  # 100 MiB
                r.wfile.write(chunk)
                sent.append(len(chunk))
        except OSError:
            return
    fake.route("GET", r"/v2/repo/manifests/big")(endless)
    fake.route("GET", r"/v2/repo/manifests/said")(lambda r, m: r.reply(
        200, b"", {"Content-Type": oci.OCI_MANIFEST, "Content-Length": str(100 << 20)}))
    with pytest.raises(RegistryError) as exc:
        reg(fake).manifest("repo", "big")
    one_line(exc, fake.addr, "/v2/repo/manifests/big", f"over the {oci.MANIFEST_CAP}-byte limit")
    time.sleep(0.2)
    assert sum(sent) < oci.MANIFEST_CAP + (16 << 20)  # the cap, plus what socket buffers held
    with pytest.raises(RegistryError, match=r"is 104857600 bytes, over the 4194304-byte limit"):
        reg(fake).manifest("repo", "said")


def test_an_index_with_too_many_children_is_refused(fake: Server) -> None:
    store = Store()
    child = image(store)
    fat = store.add_manifest({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": child, "size": 1}] * 3000}, "fat")
    fake.ping_ok()
    store.serve(fake)
    start = time.monotonic()
    with pytest.raises(RegistryError) as exc:
        oci.promote(reg(fake), "repo", reg(fake), "other", fat)
    one_line(exc, "3000 manifests", f"limit of {oci.MAX_INDEX_CHILDREN}")
    assert time.monotonic() - start < 3 and len(fake.seen) < 10


def test_nested_indexes_are_bounded(fake: Server) -> None:
    store = Store()
    ref = image(store)
    for _ in range(oci.MAX_INDEX_DEPTH + 1):
        ref = store.add_manifest({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
            {"mediaType": oci.OCI_INDEX, "digest": ref, "size": 1}]})
    fake.ping_ok()
    store.serve(fake)
    with pytest.raises(RegistryError, match="nests deeper than 2"):
        oci.promote(reg(fake), "repo", reg(fake), "other", ref)


def test_429_retry_after_is_honoured(fake: Server) -> None:
    store = Store()
    ref = image(store)
    fake.ping_ok()
    calls = []

    def limited(r: Request, m: re.Match[str]) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            r.reply(429, b"slow down", {"Retry-After": "1"})
        else:
            body, media_type = store.manifests["t"]
            r.reply(200, body, {"Content-Type": media_type})
    fake.route("GET", r"/v2/repo/manifests/t")(limited)
    assert reg(fake).manifest("repo", "t")[1].digest == ref  # type: ignore[index]
    assert calls[1] - calls[0] >= 0.95
    fake.routes[-1] = ("GET", r"/v2/repo/manifests/t", lambda r, m: r.reply(
        429, b"", {"Retry-After": "3600"}))
    with pytest.raises(RegistryError, match="Retry-After: 3600` is past the deadline"):
        reg(fake).manifest("repo", "t")


# ---- what is read is checked --------------------------------------------------------------------


def test_a_manifest_not_matching_its_digest_is_refused(fake: Server) -> None:
    store = Store()
    image(store)
    claimed = "sha256:" + "b" * 64
    fake.ping_ok()
    fake.route("GET", rf"/v2/repo/manifests/{claimed}")(lambda r, m: r.reply(
        200, store.manifests["t"][0], {"Content-Type": oci.OCI_MANIFEST}))
    with pytest.raises(RegistryError) as exc:
        reg(fake).manifest("repo", claimed)
    one_line(exc, "hash to " + digest(store.manifests["t"][0]), "not " + claimed)


def test_a_blob_not_matching_its_digest_is_refused(fake: Server) -> None:
    fake.ping_ok()
    wanted = digest(b"good")
    fake.route("GET", r"/v2/repo/blobs/.*")(lambda r, m: r.reply(200, b"evil"))
    with pytest.raises(RegistryError) as exc:
        reg(fake).blob("repo", wanted)
    one_line(exc, digest(b"evil"), wanted)


@pytest.mark.parametrize("answer, problem", [
    ((b"<html>not json</html>", {"Content-Type": oci.OCI_MANIFEST}), "the manifest is not JSON"),
    ((b'{"schemaVersion": 2}', {}), "no Content-Type and the manifest no mediaType"),
    ((b'{"layers": [{"digest": "../../etc"}]}', {"Content-Type": oci.OCI_MANIFEST}),
     "is not a sha256 digest"),
    ((b'[1, 2]', {"Content-Type": oci.OCI_MANIFEST}), "not a JSON object"),
])
def test_each_malformed_manifest_is_one_line(fake: Server, answer: tuple[bytes, dict[str, str]],
                                             problem: str) -> None:
    fake.ping_ok()
    body, headers = answer
    fake.route("GET", r"/v2/repo/manifests/t")(lambda r, m: r.reply(200, body, headers))
    with pytest.raises(RegistryError) as exc:
        reg(fake).manifest("repo", "t")
    one_line(exc, fake.addr, "GET", "/v2/repo/manifests/t", problem)


def test_a_config_whose_labels_are_a_list_is_one_line(fake: Server) -> None:
    store = Store()
    config = store.add_blob(json.dumps({"config": {"Labels": ["a", "b"]}}).encode())
    fake.ping_ok()
    store.serve(fake)
    with pytest.raises(RegistryError) as exc:
        reg(fake).labels("repo", config)
    one_line(exc, fake.addr, "`config.Labels` is not a map of strings")


def test_a_token_endpoint_answering_garbage_is_one_line(fake: Server) -> None:
    realm = f"http://{fake.addr}/token"
    fake.route("GET", "/v2/")(lambda r, m: r.reply(401, b"", {
        "WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'}))
    fake.route("GET", r"/token\?.*")(lambda r, m: r.reply(200, b"\x00garbage"))
    with pytest.raises(RegistryError) as exc:
        reg(fake).manifest("repo", "t")
    one_line(exc, fake.addr, "GET", "/token", "the token answer is not JSON")


# ---- streaming ----------------------------------------------------------------------------------


def test_an_interrupted_upload_resumes(fake: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oci_blobs, "CHUNK", 64 << 10)
    data = os.urandom(300 << 10)
    received = bytearray()
    patches = []
    fake.ping_ok()
    fake.route("HEAD", r"/v2/repo/blobs/.*")(lambda r, m: r.reply(404))
    fake.route("POST", r"/v2/repo/blobs/uploads/")(lambda r, m: r.reply(
        202, b"", {"Location": "/v2/repo/blobs/uploads/u1"}))

    def patch(r: Request, m: re.Match[str]) -> None:
        body = r.body()
        start = int(r.headers["Content-Range"].split("-")[0])
        assert start == len(received), (start, len(received))
        patches.append(start)
        if len(patches) == 2:  # the second PATCH breaks half-way: half of it arrived
            received.extend(body[: len(body) // 2])
            r.close_connection = True
            r.connection.shutdown(2)
            return
        received.extend(body)
        r.reply(202, b"", {"Location": "/v2/repo/blobs/uploads/u1",
                           "Range": f"0-{len(received) - 1}"})
    fake.route("PATCH", r"/v2/repo/blobs/uploads/u1")(patch)
    fake.route("GET", r"/v2/repo/blobs/uploads/u1")(lambda r, m: r.reply(
        204, b"", {"Range": f"0-{len(received) - 1}"}))

    def put(r: Request, m: re.Match[str]) -> None:
        ok = "sha256%3A" + hashlib.sha256(received).hexdigest() in r.path
        r.reply(201 if ok else 400, b"")
    fake.route("PUT", r"/v2/repo/blobs/uploads/u1\?.*")(put)
    assert reg(fake).push_blob("repo", data) == digest(data)
    assert bytes(received) == data
    assert patches[2] == (64 << 10) + (32 << 10)  # resumed where the registry said


def test_an_upload_the_registry_cannot_resume_starts_again(
        fake: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oci_blobs, "CHUNK", 64 << 10)
    data = os.urandom(200 << 10)
    sessions: list[bytearray] = []
    fake.ping_ok()
    fake.route("HEAD", r"/v2/repo/blobs/.*")(lambda r, m: r.reply(404))

    def post(r: Request, m: re.Match[str]) -> None:
        sessions.append(bytearray())
        r.reply(202, b"", {"Location": f"/v2/repo/blobs/uploads/u{len(sessions)}"})

    def patch(r: Request, m: re.Match[str]) -> None:
        body = r.body()
        if len(sessions) == 1 and len(sessions[0]) >= 64 << 10:  # the first session breaks
            r.close_connection = True
            r.connection.shutdown(2)
            return
        sessions[-1].extend(body)
        r.reply(202, b"", {"Location": m.group(0)})
    fake.route("POST", r"/v2/repo/blobs/uploads/")(post)
    fake.route("PATCH", r"/v2/repo/blobs/uploads/u\d")(patch)
    fake.route("GET", r"/v2/repo/blobs/uploads/u\d")(lambda r, m: r.reply(404))  # forgotten
    fake.route("PUT", r"/v2/repo/blobs/uploads/u2\?.*")(lambda r, m: r.reply(201))
    assert reg(fake).push_blob("repo", data) == digest(data)
    assert len(sessions) == 2 and bytes(sessions[1]) == data


def test_a_download_that_breaks_resumes_with_range(fake: Server) -> None:
    data = os.urandom(200_000)
    fake.ping_ok()
    ranges = []

    def blob(r: Request, m: re.Match[str]) -> None:
        ranges.append(r.headers.get("Range"))
        if len(ranges) == 1:  # half, then the connection drops
            r.send_response(200)
            r.send_header("Content-Length", str(len(data)))
            r.end_headers()
            r.wfile.write(data[:100_000])
            r.wfile.flush()
            r.connection.shutdown(2)
            return
        start = int(r.headers["Range"].split("=")[1].rstrip("-"))
        r.reply(206, data[start:], {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})
    fake.route("GET", r"/v2/repo/blobs/.*")(blob)
    got = b"".join(reg(fake).stream_blob("repo", digest(data), len(data)))
    assert got == data and ranges == [None, "bytes=100000-"]


# ---- referrers ----------------------------------------------------------------------------------


def test_referrers_api_first_and_the_tag_only_when_it_is_absent(fake: Server) -> None:
    store = Store()
    subject = image(store)
    payload = b'{"smoke": "ok"}'
    layer = store.add_blob(payload)
    empty = store.add_blob(b"{}")
    tag = oci.artifact_tag(subject, "smoke")
    artifact = store.add_manifest({
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST, "artifactType": "application/x-smoke",
        "config": {"mediaType": oci.EMPTY_CONFIG, "digest": empty, "size": 2},
        "layers": [{"mediaType": "application/x-smoke", "digest": layer, "size": len(payload)}],
        "subject": {"mediaType": oci.OCI_MANIFEST, "digest": subject, "size": 1},
        "annotations": {oci.REF_NAME: tag}}, tag)
    fake.ping_ok()
    fake.route("GET", rf"/v2/repo/referrers/{subject}.*")(lambda r, m: r.reply(
        200, json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
            {"mediaType": oci.OCI_MANIFEST, "digest": artifact, "size": 1,
             "artifactType": "application/x-smoke", "annotations": {oci.REF_NAME: tag}},
            {"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "c" * 64, "size": 1,
             "artifactType": "application/x-other"}]}).encode(),
        {"Content-Type": oci.OCI_INDEX}))
    store.serve(fake)
    r = reg(fake)
    assert r.fetch_artifact("repo", subject, "smoke", "application/x-smoke") == payload
    asked = [s.path for s in fake.seen if "/manifests/" in s.path]
    assert asked == [f"/v2/repo/manifests/{artifact}"]  # never the fallback tag
    assert any("artifactType=application%2Fx-smoke" in s.path for s in fake.seen)
    assert r.fetch_artifact("repo", subject, "sbom") is None

    fake.seen.clear()
    fake.routes.pop(1)  # the registry has no referrers API: 404, then the tag
    assert r.fetch_artifact("repo", subject, "smoke") == payload
    assert f"/v2/repo/manifests/{tag}" in [s.path for s in fake.seen]


def test_an_artifact_is_pushed_with_its_subject(fake: Server) -> None:
    manifests: dict[str, bytes] = {}
    fake.ping_ok()
    fake.route("HEAD", r"/v2/repo/blobs/.*")(lambda r, m: r.reply(200))

    def put(r: Request, m: re.Match[str]) -> None:
        manifests[m.group(1)] = r.body()
        r.reply(201, b"", {"Docker-Content-Digest": digest(manifests[m.group(1)])})
    fake.route("PUT", r"/v2/repo/manifests/(.+)")(put)
    subject = oci.Descriptor("sha256:" + "d" * 64, oci.OCI_MANIFEST, 10)
    reg(fake).push_artifact("repo", subject, "application/x-smoke", b"{}", kind="smoke",
                            title="smoke.json")
    doc = json.loads(manifests[oci.artifact_tag(subject.digest, "smoke")])
    assert doc["subject"]["digest"] == subject.digest
    assert doc["artifactType"] == "application/x-smoke"


def test_verify_refuses_a_nested_index_and_a_made_up_platform(fake: Server) -> None:
    store = Store()
    child = image(store)
    inner = store.add_manifest({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": child, "size": 1}]})
    outer = store.add_manifest({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": [
        {"mediaType": oci.OCI_INDEX, "digest": inner, "size": 1,
         "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": oci.OCI_MANIFEST, "digest": child, "size": 1,
         "platform": {"os": "plan9", "architecture": "mips"}}]})
    fake.ping_ok()
    store.serve(fake)
    _, [signature, *rows] = verify.verify(verify.Reference(fake.addr, "repo", outer),
                                          verify.Policy(contents_only=True))
    assert (signature.what, signature.status) == ("signature", verify.UNSIGNED)  # no --key
    assert [(r.what, r.status) for r in rows] == [
        ("linux/amd64 manifest", verify.BAD), ("plan9/mips manifest", verify.BAD)]
    assert "nested index" in rows[0].detail and "linux/amd64" in rows[1].detail


def test_a_registry_refusing_artifacts_is_reported_clearly(fake: Server) -> None:
    fake.ping_ok()
    fake.route("HEAD", r"/v2/repo/blobs/.*")(lambda r, m: r.reply(200))
    fake.route("PUT", r"/v2/repo/manifests/.*")(lambda r, m: r.reply(
        400, b'{"errors":[{"code":"MANIFEST_INVALID"}]}'))
    subject = oci.Descriptor("sha256:" + "d" * 64, oci.OCI_MANIFEST, 10)
    with pytest.raises(RegistryError) as exc:
        reg(fake).push_artifact("repo", subject, "application/x-smoke", b"{}", kind="smoke",
                                title="smoke.json")
    one_line(exc, fake.addr, "supports neither the referrers API nor its tag fallback")


def test_an_identity_token_is_exchanged_with_a_post(fake: Server, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {fake.addr: {"identitytoken": "refresh-me"}}}))
    forms: list[str] = []

    def token(r: Request, m: re.Match[str]) -> None:
        forms.append(r.body().decode())
        r.reply(200, json.dumps({"access_token": "A", "expires_in": 300}).encode())
    fake.route("POST", "/oauth2/token")(token)
    realm = f"http://{fake.addr}/oauth2/token"
    fake.route("GET", "/v2/")(lambda r, m: r.reply(401, b"", {
        "WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'}))
    fake.route("HEAD", r"/v2/repo/manifests/t")(lambda r, m: r.reply(
        200 if r.headers.get("Authorization") == "Bearer A" else 401, b"", {
            "Docker-Content-Digest": "sha256:" + "e" * 64, "Content-Type": oci.OCI_MANIFEST,
            "WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'}))
    assert reg(fake).head("repo", "t").digest == "sha256:" + "e" * 64  # type: ignore[union-attr]
    assert "grant_type=refresh_token" in forms[0] and "refresh_token=refresh-me" in forms[0]
    assert "scope=repository%3Arepo%3Apull" in forms[0]


def test_docker_push_sees_the_environment_credentials(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(
        {"credsStore": "pass", "credHelpers": {"r.example": "ecr-login", "o.example": "gcloud"}}))
    monkeypatch.delenv("REGISTRY_USERNAME", raising=False)
    with registry_auth.docker_env("r.example") as env:
        assert env == {}
    monkeypatch.setenv("REGISTRY_USERNAME", "ci")
    monkeypatch.setenv("REGISTRY_PASSWORD", "pw")
    with registry_auth.docker_env("r.example") as env:
        folder = Path(env["DOCKER_CONFIG"])
        doc = json.loads((folder / "config.json").read_text())
        assert (folder / "config.json").stat().st_mode & 0o077 == 0
    assert not folder.exists()
    assert "credsStore" not in doc and doc["credHelpers"] == {"o.example": "gcloud"}
    assert doc["auths"]["r.example"]["auth"] == basic("ci", "pw").split()[1]


def test_insecure_registry_option_of_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser("plan").parse_args(["plan", "--insecure-registry", "10.9.0.0/16"])
    assert not registry_http.is_insecure("10.9.8.7:5000")
    with settings.applied(resolve(args)):  # what cli.run does with it
        assert registry_http.is_insecure("10.9.8.7:5000")


def test_plan_asks_a_trickling_registry_within_its_short_deadline(fake: Server) -> None:
    fake.ping_ok()
    fake.route("HEAD", r"/v2/repo/manifests/.*")(trickle_headers)
    start = time.monotonic()
    assert plan.registry_has(fake.addr, "repo", "t", timeout=0.5) is False  # "build", quickly
    assert time.monotonic() - start < 3


def test_a_refusal_with_a_multi_line_body_stays_one_line(fake: Server) -> None:
    fake.ping_ok()
    fake.route("GET", r"/v2/repo/manifests/t")(lambda r, m: r.reply(
        400, b'{\n  "errors": [\x1b[31m"DENIED"\n]}\r\n' + b"x" * 5000))
    with pytest.raises(RegistryError) as exc:
        reg(fake).manifest("repo", "t")
    text = one_line(exc, fake.addr, "refused: HTTP 400", '"errors": [ [31m"DENIED" ]}')
    assert "\x1b" not in text and len(text) < 400


def test_docker_hub_is_served_by_its_api_host() -> None:
    assert registry_http.Session("docker.io", scheme="https").base == \
        "https://registry-1.docker.io"
    assert registry_http.Session("ghcr.io", scheme="https").base == "https://ghcr.io"


def test_the_retry_backoff_is_read_when_called(monkeypatch):
    """BACKOFF_S is read at call time (a default argument captured it at import, so a test's
    monkeypatch never took and a unit test slept 7 s for real)."""
    slept: list[float] = []
    monkeypatch.setattr(oci, "BACKOFF_S", (0.25,))
    monkeypatch.setattr(oci.time, "sleep", slept.append)

    def down() -> None:
        raise OSError("connection reset")

    with pytest.raises(oci.RegistryError, match="failed"):
        oci.retry("a read", "127.0.0.1:1", down)
    assert slept == [0.25]
    assert oci.Registry("127.0.0.1:1").backoff == (0.25,)
