"""`python -m bench promote`: cross-registry promotion in bounded memory.

Two local registries (Debian's docker-registry) stand for CI's staging registry and the
platform team's vetted one. A synthetic image of random, incompressible layers (default 4.5 GB
as a CUDA slim image is, one layer of 3 GB) is streamed into staging by the client itself, then
a separate process promotes it by digest into the vetted registry (`oci.promote`: each blob
streamed once from source to target). Its peak RSS (VmHWM, read by the process itself at the
end) and wall time are measured, next to a baseline process that only reads the manifest.
Goal: peak RSS <= 250 MB. Writes bench/promote.json.

Synthetic by default (random layers are the worst case for any compression, and no build is
needed); `--image LOCAL_REF` promotes a real local image instead (e.g. a built CUDA slim image,
`docker push`ed into staging first) and writes bench/promote-image.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from builder.core import engine, oci, oci_blobs, registry

HERE = Path(__file__).resolve().parent
GOAL_MB = 250.0
PIECE = 4 << 20


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def random_bytes(size: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    left = size
    while left:
        n = min(PIECE, left)
        left -= n
        yield rng.randbytes(n)


def push_synthetic(addr: str, repository: str, layer_sizes: list[int]) -> str:
    """Stream random layers into `addr/repository`; returns the manifest digest."""
    reg = oci.Registry(addr)
    layers = []
    for n, size in enumerate(layer_sizes):
        digest = reg.upload(repository, None, size, random_bytes(size, seed=n))
        layers.append({"mediaType": oci.OCI_LAYER_GZIP, "digest": digest, "size": size})
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": [x["digest"] for x in layers]}}).encode()
    doc = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST, "layers": layers,
           "config": {"mediaType": oci.OCI_CONFIG, "digest": reg.push_blob(repository, config),
                      "size": len(config)}}
    body = json.dumps(doc).encode()
    return reg.put_manifest(repository, "synthetic", body, oci.OCI_MANIFEST)


def push_local_image(addr: str, repository: str, image: str) -> str:
    """`docker push` a local image into `addr/repository` (a tag of our own, removed after);
    its manifest digest."""
    ref = f"{addr}/{repository}:real"
    engine.docker("tag", image, ref)
    try:
        engine.docker("push", ref, timeout=3600)
    finally:
        engine.docker("image", "rm", ref, check=False)
    found = oci.Registry(addr).head(repository, "real")
    assert found is not None
    return found.digest


def measured(argv: list[str]) -> tuple[float, float, str]:
    """(peak RSS in MB, seconds, stdout) of a child process."""
    start = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench promote: `{' '.join(argv)}` failed")
    return usage.ru_maxrss / 1024, seconds, out


def worker(argv: list[str]) -> int:
    """The measured process: `promote-worker SRC DST DIGEST [--baseline]`."""
    source, target, digest = argv[:3]
    src = oci.Registry(source)
    imported = vm_hwm_mb()
    if "--baseline" in argv:
        src.manifest("staging", digest)
    else:
        oci.promote(src, "staging", oci.Registry(target), "vetted", digest)
    print(json.dumps({"hwm_after_imports_mb": imported, "hwm_end_mb": vm_hwm_mb()}))
    return 0


def vm_hwm_mb() -> float:
    """This process's peak resident set so far (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench promote", description=__doc__)
    parser.add_argument("--layers-gb", default="3.0,1.0,0.5",
                        help="layer sizes in GB (default 3.0,1.0,0.5: 4.5 GB)")
    parser.add_argument("--image", metavar="LOCAL_REF",
                        help="promote this local image (e.g. a built CUDA slim image, pushed "
                        "with docker push) instead of a synthetic one")
    args = parser.parse_args(argv)
    sizes = [int(float(x) * 1e9) for x in args.layers_gb.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-promote-", dir="/var/tmp") as tmp:
        staging, vetted = free_addr(), free_addr()
        registry.start(staging, Path(tmp) / "staging")
        registry.start(vetted, Path(tmp) / "vetted")
        try:
            start = time.monotonic()
            if args.image:
                digest = push_local_image(staging, "staging", args.image)
                doc = json.loads(oci.Registry(staging).manifest("staging", digest)[0])  # type: ignore[index]
                sizes = [layer["size"] for layer in doc["layers"]]
            else:
                digest = push_synthetic(staging, "staging", sizes)
            push_s = time.monotonic() - start
            py = [sys.executable, "-m", "bench", "promote-worker", staging, vetted, digest]
            _, _, out = measured([*py, "--baseline"])
            baseline = json.loads(out.strip().splitlines()[-1])
            maxrss_mb, seconds, out = measured(py)
            inside = json.loads(out.strip().splitlines()[-1])
            peak_mb = inside["hwm_end_mb"]
            promoted = oci.Registry(vetted).head("vetted", digest)
        finally:
            registry.stop(Path(tmp) / "staging")
            registry.stop(Path(tmp) / "vetted")
    total = sum(sizes)
    what = f"the local image {args.image} (compressed layers, as pushed)" if args.image else \
        "a synthetic image of random layers"
    result = {
        "what": f"cross-registry promotion of {what} (two local docker-registry 2.8, plain "
                "HTTP on loopback)",
        "layers_bytes": sizes, "total_bytes": total, "push_seconds": round(push_s, 1),
        "promote_seconds": round(seconds, 1),
        "promote_mb_per_s": round(total / 1e6 / seconds, 1),
        "peak_rss_mb": peak_mb,
        "peak_rss_after_imports_mb": inside["hwm_after_imports_mb"],
        "baseline_peak_rss_mb": baseline["hwm_end_mb"],
        # wait4's ru_maxrss also counts the parent's pages the child held between fork and exec
        "ru_maxrss_mb_upper_bound": round(maxrss_mb, 1),
        "goal_peak_rss_mb": GOAL_MB, "met": peak_mb <= GOAL_MB and promoted is not None,
        "chunk_bytes": oci_blobs.CHUNK, "digest": digest,
    }
    out = HERE / ("promote-image.json" if args.image else "promote.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["met"] else 1
