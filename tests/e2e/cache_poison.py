"""What the signed-cache tests share (issue 40 item 1): the forgery of someone with push rights
to the staging repository (a `.pth` layer in the cache image), and how a test reads what a
build did with the registry's cache (its one cache line, its BuildKit log, the image's files).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

from builder.core import engine, oci

EVIL = "opt/venv/lib/python3.11/site-packages/zz-evil.pth"


def cache_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line that says whether the registry's cache was used and why (not)."""
    [line] = [x.strip() for x in result.stderr.splitlines() if "registry cache `" in x]
    return line


def build_log(result: subprocess.CompletedProcess[str]) -> str:
    """BuildKit's log of the one build the command ran."""
    [log] = re.findall(r"building \(log: (\S+)\)", result.stderr)
    return Path(log).read_text(errors="replace")


def shown(result: subprocess.CompletedProcess[str], log: str) -> None:
    """Print the cache line and what BuildKit's log says of the cache (pytest -rP shows it)."""
    imported = [x for x in log.splitlines() if "importing cache manifest" in x]
    print(cache_line(result), *imported[:1],
          f"BuildKit log: {log.count(' CACHED')} CACHED steps", sep="\n")


def image_files(image: str) -> set[str]:
    """Every path in the image's filesystem (a container created, exported, removed)."""
    container = engine.docker("create", image, "true").stdout.strip()
    try:
        listing = subprocess.run(f"/usr/bin/docker export {container} | tar -t", shell=True,
                                 capture_output=True, text=True, check=True, timeout=600)
    finally:
        engine.docker("rm", "-f", container, check=False)
    return {line.rstrip("/") for line in listing.stdout.splitlines()}


def poison(reg: oci.Registry, repository: str, tag: str) -> str:
    """What someone with push rights to the staging repository does: the cache image's last
    layer replaced by one adding a `.pth` file to site-packages, its diff id in the config too
    (the inline cache kept); returns the poisoned manifest's digest."""
    body, _ = reg.manifest(repository, tag) or (b"", None)
    manifest = json.loads(body)
    config = reg.config(repository, manifest["config"]["digest"])
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        payload = b"import os; os.environ.setdefault('POISONED', '1')\n"
        info = tarfile.TarInfo(EVIL)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config["rootfs"]["diff_ids"][-1] = oci.sha256(raw.getvalue())
    config_bytes = json.dumps(config).encode()
    manifest["layers"][-1] = {**manifest["layers"][-1], "size": len(layer),
                              "digest": reg.push_blob(repository, layer)}
    manifest["config"] = {**manifest["config"], "size": len(config_bytes),
                          "digest": reg.push_blob(repository, config_bytes)}
    return reg.put_manifest(repository, tag, json.dumps(manifest).encode(),
                            manifest["mediaType"])
