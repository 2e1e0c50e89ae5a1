"""The mock sigstore services of the keyless e2e tests (`@sigstore/mock`'s Fulcio and Rekor,
tests/e2e/sigstore_mock, pinned with integrity hashes in its package-lock.json) and a mock
GitHub OIDC token: one copy for every module that signs keylessly on loopback (the keyless
rehearsal, the real publication attested by identity, publish trusting an identity alone)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    claims = {"iss": issuer, "aud": "sigstore", "iat": now, "nbf": now, "exp": now + 600,
              "sub": f"repo:torch-images/torch-images:ref:{ref}", "mock_san": subject,
              "job_workflow_ref": workflow_ref, "repository": "torch-images/torch-images",
              "ref": ref, "sha": "0" * 40, "event_name": "push", "workflow": "build"}
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
