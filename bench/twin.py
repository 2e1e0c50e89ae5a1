"""`python -m bench twin --image LOCAL_REF`: what publish's zstd twin costs (builder.stages.twin).

A local image (e.g. the built CPU runtime) is `docker push`ed into a loopback registry of the
bench's own; then, in this process, its twin is made (`twin.make`) again and again:
- `sequential`: one layer at a time (MAX_LAYERS = 1, as before issue 39), an empty cache;
- `pooled`: pool_size() layers at once (the largest first), an empty cache;
- `cached`: pooled, with the cache the previous run filled (a publish of the same layers again:
  the e2e suite's republishes, a security rebuild's unchanged layers).
Cold runs alternate their order between rounds (a loaded shared machine drifts); every run
records the 1-minute load average before it, its wall and CPU seconds (every thread's) and the
twin digest, which must be the same in every run. Writes bench/twin.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.promote import free_addr, push_local_image, vm_hwm_mb
from bench.pull import cpu_seconds, load
from builder.core import oci, registry, zstd
from builder.stages import twin

HERE = Path(__file__).resolve().parent
REPO = "bench-twin"


def one_run(reg: oci.Registry, digest: str, kind: str, cache: Path) -> dict[str, Any]:
    """One `twin.make` of `digest`, timed."""
    os.environ["BUILDER_TWIN_CACHE"] = str(cache)
    twin.MAX_LAYERS = 1 if kind == "sequential" else 4
    report, before, cpu, start = twin.Report(), load(), cpu_seconds(), time.monotonic()
    made = twin.make(reg, REPO, digest, report=report)
    return {"kind": kind, "load_before": before, "wall_s": round(time.monotonic() - start, 1),
            "cpu_s": round(cpu_seconds() - cpu, 1), "layers_at_once": twin.pool_size(),
            "twin": made.digest, **report.as_json()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench twin", description=__doc__)
    parser.add_argument("--image", required=True, metavar="LOCAL_REF",
                        help="the local image to twin (e.g. the CPU runtime `builder build` made)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three runs")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-twin-", dir="/var/tmp") as tmp:
        os.environ["BUILDER_STATE"] = str(Path(tmp) / "state")
        addr = free_addr()
        registry.start(addr, Path(tmp) / "registry")
        try:
            digest = push_local_image(addr, REPO, args.image)
            reg = oci.Registry(addr)
            for n in range(args.rounds):
                cold = ["sequential", "pooled"] if n % 2 == 0 else ["pooled", "sequential"]
                for kind in cold:
                    runs.append(one_run(reg, digest, kind, Path(tmp) / f"cache-{n}-{kind}"))
                runs.append(one_run(reg, digest, "cached", Path(tmp) / f"cache-{n}-pooled"))
        finally:
            registry.stop(Path(tmp) / "registry")
    result = {"what": f"zstd twin of {args.image} in a loopback docker-registry",
              "cores": os.cpu_count(), "encoder": zstd.ENCODER, "peak_rss_mb": vm_hwm_mb(),
              "same_twin_every_run": len({r["twin"] for r in runs}) == 1, "runs": runs}
    (HERE / "twin.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["same_twin_every_run"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
