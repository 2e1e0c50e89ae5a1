"""Make tests/fixtures/sigstore_mock/publication/: the sigstore bundles of one identity-signed
publication, signed by builder's own signer (sigstore-python) against the mock services, for
the unit tests of builder.core.vouch (every reader that trusts an identity). Run from the
repository root: `.venv/bin/python tests/e2e/make_keyless_fixtures.py` (Node and the mock's
packages, `npm ci` in tests/e2e/sigstore_mock, needed)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keyless_mock import MAIN, serving, token

from builder.core import keyless, sign

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "sigstore_mock" / "publication"
NAME, DIGEST = "r.example:5000/torch", "sha256:" + "ef" * 32
VID = "2.13.0-py3.11-cpu-runtime"
TAGS = sign.tag_annotations(VID, [f"{VID}-20261201", VID, "build-abc"])
CACHE = sign.tag_annotations(VID, [f"cache-{VID}"])  # the staging repository's build cache
EVIDENCE = {"sbom": {"bomFormat": "CycloneDX", "specVersion": "1.6"},
            "smoke": {"status": "pass", "image_id": "sha256:" + "01" * 32},
            "provenance": {"buildDefinition": {"buildType": "torch-images"}}}


def statements() -> list[dict[str, object]]:
    """The image statement naming its tags, one per piece of evidence, and the same digest's
    statement as the staging repository's cache image."""
    image = sign.statement(NAME, DIGEST, keyless.IMAGE_PREDICATE, {"optional": TAGS})
    cache = sign.statement(f"{NAME}-staging", DIGEST, keyless.IMAGE_PREDICATE,
                           {"optional": CACHE})
    return [image, *(sign.statement(NAME, DIGEST, sign.PREDICATES[kind], doc)
                     for kind, doc in EVIDENCE.items()), cache]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, serving(Path(tmp)) as mock:
        config = mock / "trust_config.json"
        made = keyless.sign_statements(token(MAIN), config, statements())
        for name, data in zip(["image", *EVIDENCE, "cache"], made, strict=True):
            (OUT / f"{name}.sigstore.json").write_bytes(data)
        dev = MAIN.replace("heads/main", "heads/dev")
        (OUT / "image_dev.sigstore.json").write_bytes(
            keyless.sign_statements(token(dev), config, statements()[:1])[0])
        shutil.copy(mock / "trusted_root.json", OUT / "trusted_root.json")
    print(json.dumps(sorted(p.name for p in OUT.iterdir())))


if __name__ == "__main__":
    main()
