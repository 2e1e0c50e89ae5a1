"""Our SBOM against syft's on one image: time, component counts, purls each finds.

    python -m bench.sbom_vs_syft IMAGE [--json]

Purls are compared parsed, as (type, namespace, name, version), qualifiers ignored: syft and
packageurl-python encode deb epochs and qualifiers differently.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from packageurl import PackageURL

from builder import engine, proc

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


def run_syft(image_ref: str) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    env = {"SYFT_CHECK_FOR_APP_UPDATE": "false", "DOCKER_HOST": engine.engine_address()}
    result = proc.run(["syft", f"docker:{image_ref}", "-o", "cyclonedx-json", "-q"],
                      env=env, timeout=1800)
    return json.loads(result.stdout), time.monotonic() - start


def run_ours(image_ref: str) -> tuple[dict[str, Any], float, str]:
    """`sbom.generate`, its lazy imports timed too; also how the filesystem was read."""
    start = time.monotonic()
    from sbom.bom import build_document
    from sbom.collect import collect

    facts = collect(image_ref)
    doc = build_document(facts)
    return doc, time.monotonic() - start, facts.contents.collector


def compare(image_ref: str) -> dict[str, Any]:
    """Timing and coverage of `sbom.generate` against `syft docker:IMAGE -o cyclonedx-json`."""
    ours, t_ours, collector = run_ours(image_ref)
    theirs, t_syft = run_syft(image_ref)
    ours_types, ours_keys = _summary(ours)
    syft_types, syft_keys = _summary(theirs)

    def fmt(keys: set[PurlKey]) -> list[str]:
        return sorted(f"pkg:{t}/{ns + '/' if ns else ''}{n}@{v}" for t, ns, n, v in keys)

    return {
        "image": image_ref,
        "seconds": {"ours": round(t_ours, 2), "syft": round(t_syft, 2),
                    "speedup": round(t_syft / t_ours, 1) if t_ours else None},
        "collector": collector,
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
    args = parser.parse_args(argv)
    result = compare(args.image)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s = result["seconds"]
    print(f"{result['image']}: ours {s['ours']} s ({result['collector']}), syft {s['syft']} s "
          f"({s['speedup']}× faster)")
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
