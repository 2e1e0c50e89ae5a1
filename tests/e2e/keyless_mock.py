"""The mock sigstore services of the keyless e2e tests (`@sigstore/mock`'s Fulcio and Rekor,
tests/e2e/sigstore_mock, pinned with integrity hashes in its package-lock.json), a mock
GitHub OIDC token and a stand-in for GitHub's OIDC token endpoint: one copy for every module
that signs keylessly on loopback (the keyless rehearsal, the real publication attested by
identity, publish trusting an identity alone, the workflow rehearsal's jobs)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import missing

from builder.core import keyless

MOCK = Path(__file__).resolve().parent / "sigstore_mock"
ISSUER = keyless.GITHUB_ISSUER
WORKFLOW = "torch-images/torch-images/.github/workflows/build.yml"
MAIN = f"https://github.com/{WORKFLOW}@refs/heads/main"
PULL = f"https://github.com/{WORKFLOW}@refs/pull/7/merge"


def token(subject: str, issuer: str = ISSUER) -> str:
    """A GitHub-shaped OIDC token for audience `sigstore` (the mock Fulcio checks no signature;
    `mock_san` is the certificate subject real Fulcio derives from `job_workflow_ref`)."""
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    now = int(time.time())
    workflow_ref = subject.removeprefix("https://github.com/")
    ref = workflow_ref.partition("@")[2]
    repository = workflow_ref.partition("/.github/")[0]
    claims = {"iss": issuer, "aud": "sigstore", "iat": now, "nbf": now, "exp": now + 600,
              "sub": f"repo:{repository}:ref:{ref}", "mock_san": subject,
              "job_workflow_ref": workflow_ref, "repository": repository,
              "ref": ref, "sha": "0" * 40, "event_name": "push",
              "workflow": Path(workflow_ref.partition("@")[0]).stem}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.{part({'sig': 'none'})}"


@contextlib.contextmanager
def serving(folder: Path, clock: str | None = None) -> Iterator[Path]:
    """The mock services on a free loopback port (their CA's clock at `clock`, an ISO time);
    `folder` holds their trusted root, client trust config and `url`. `npm ci` installs the
    pinned packages when they are not there yet."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        missing("Node.js and npm (the mock sigstore services run on Node)")
    if not (MOCK / "node_modules" / "@sigstore" / "mock").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=MOCK,
                       check=True, capture_output=True, timeout=600)
    env = {**os.environ, **({"MOCK_CLOCK": clock} if clock else {})}
    proc = subprocess.Popen(["node", "serve.js", str(folder)], cwd=MOCK, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        (folder / "url").write_text(json.loads(proc.stdout.readline())["url"])
        yield folder
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with serving(tmp_path_factory.mktemp("sigstore-mock")) as folder:
        yield folder


def by(identity: str = MAIN, issuer: str = ISSUER) -> tuple[str, ...]:
    return ("--certificate-identity", identity, "--certificate-oidc-issuer", issuer)


@dataclass(frozen=True)
class OidcEndpoint:
    """GitHub's OIDC token endpoint as a job sees it: `grant` gives a job with `id-token:
    write` its ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN, and a GET of
    `<url>&audience=sigstore` with `Authorization: bearer <that token>` answers `{"value":
    <a mock token whose subject is the job's workflow identity>}` (what builder asks through
    sigstore-python's detect_credential when it signs)."""

    url: str
    granted: dict[str, str] = field(default_factory=dict)  # request token -> identity

    def grant(self, job_workflow_ref: str) -> dict[str, str]:
        """The job's request variables, for `OWNER/REPO/.github/workflows/F@REF`."""
        request = uuid.uuid4().hex
        self.granted[request] = f"https://github.com/{job_workflow_ref}"
        return {"ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.url}/token?api-version=2.0",
                "ACTIONS_ID_TOKEN_REQUEST_TOKEN": request}

    def answer(self, path: str, authorization: str) -> tuple[int, dict[str, str]]:
        """(status, body) of one token request: 401 without a granted request token, 400 for
        another audience than sigstore's (the only one these jobs ask for)."""
        scheme, _, request = authorization.partition(" ")
        identity = self.granted.get(request) if scheme.lower() == "bearer" else None
        if identity is None:
            return 401, {"message": "no request token granted to a job"}
        audience = parse_qs(urlsplit(path).query).get("audience", [""])[0]
        if audience != "sigstore":
            return 400, {"message": f"audience {audience!r}: only `sigstore` is served"}
        return 200, {"value": token(identity)}


@contextlib.contextmanager
def oidc_endpoint() -> Iterator[OidcEndpoint]:
    """The endpoint on a free loopback port, served from a thread while in use."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name for a GET
            status, body = endpoint.answer(self.path, self.headers.get("Authorization", ""))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint = OidcEndpoint(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
