"""The baseline: the Dockerfile most people would write for the same torch and python.

    FROM torch-images-base:bookworm          (plain mmdebstrap minbase: what `debian:bookworm`
                                              gives a user; ours starts from its -slim sibling)
    RUN apt-get update && apt-get install -y python3-venv
    RUN python3 -m venv /v && /v/bin/pip install --no-cache-dir torch==X numpy

A CPU torch from a local wheel folder is bind-mounted from the bench's temporary build context
(not COPYed, which would keep the 200 MB wheel in a layer). pip reaches PyPI over https with the
host's CA bundle passed as a BuildKit secret (never stored in a layer). Built with --no-cache.
"""

from __future__ import annotations

import glob
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from builder.core import engine, settings
from builder.core.errors import BuilderError
from builder.model import bases
from builder.stages import base

SUITE = "bookworm"
BASE = bases.bootstrap_ref(SUITE, slim=False)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
REPO = "torch-bench-naive"


@dataclass
class NaiveBuild:
    tag: str
    seconds: float
    size: int
    dockerfile: str


def dockerfile(torch: str, wheel_name: str | None) -> str:
    mounts = ["--mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt"]
    if wheel_name:
        mounts.append(f"--mount=type=bind,source={wheel_name},target=/tmp/{wheel_name}")
        spec = f"/tmp/{wheel_name}"
    else:
        spec = f"torch=={torch}"
    mount_lines = "".join(f"    {m} \\\n" for m in mounts)
    return (
        f"FROM {BASE}\n"
        "RUN apt-get update && apt-get install -y python3-venv\n"
        f"RUN {mount_lines.lstrip()}"
        "    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \\\n"
        "    sh -c 'python3 -m venv /v && /v/bin/pip install --no-cache-dir "
        f"{spec} numpy'\n"
        'ENV PATH=/v/bin:$PATH\nCMD ["python"]\n'
    )


def local_wheel(torch: str, python: str, find_links: tuple[str, ...]) -> Path | None:
    """The local torch wheel for `2.13.0+cpu` on cp311 in the variant's find-links (or the
    mirror that stands in for their URLs here), if any."""
    tag = "cp" + python.replace(".", "")
    for folder in settings.current().wheel_sources(find_links):
        hits = sorted(glob.glob(f"{folder}/torch-{torch}-{tag}-{tag}-*.whl"))
        if hits:
            return Path(hits[0])
    return None


def build(torch: str, python: str, find_links: tuple[str, ...], log: Path) -> NaiveBuild:
    """Build the naive image cold (--no-cache); the caller removes it with `remove`."""
    if not CA_BUNDLE.exists():
        raise BuilderError(f"no CA bundle at {CA_BUNDLE} for pip inside the naive build")
    base.bootstrap(SUITE, slim=False)  # reused when already there
    tag = f"{REPO}:{torch.replace('+', '-')}-py{python}"
    wheel = local_wheel(torch, python, find_links)
    text = dockerfile(torch, wheel.name if wheel else None)
    with tempfile.TemporaryDirectory(prefix="bench-naive-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(text)
        if wheel:
            try:
                (ctx / wheel.name).hardlink_to(wheel)
            except OSError:
                shutil.copy2(wheel, ctx / wheel.name)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        start = time.monotonic()
        engine.docker("build", "--no-cache", "--progress=plain", "--secret",
                      f"id=ca,src={CA_BUNDLE}", "-t", tag, str(ctx), log=log, timeout=4 * 3600)
        seconds = time.monotonic() - start
    info = engine.inspect_image(tag) or {}
    return NaiveBuild(tag, seconds, int(info.get("Size", 0)), text)


def remove(tag: str) -> None:
    engine.remove_image(tag)
