"""`python -m bench [--quick|--full]`: the pipeline's figures against a naive Dockerfile and syft.

--quick (default) uses the CPU torch (runtime + slim); --full adds the CUDA torch 2.15.0 (py3.11
runtime, slim, devel) and times the CUDA runtime's cold build instead of the CPU one.

Writes bench/results.json and bench/RESULTS.md and prints each figure as one line
`name: value unit (baseline value, ratio)`. Every image built for the naive baseline is removed.
Builds run through `python -m builder` (as a user would); Docker only via builder.core.engine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import yaml

from bench import layers, naive
from bench.figures import Figure, Results, _fmt, _mb, _ratio, figure_table
from bench.harness import (
    ROOT,
    build,
    builder_cli,
    du_top,
    image_id,
    image_ref,
    image_size,
    log,
    machine_facts,
    prune_builder_cache,
    wait_note,
    wheel_cache_kept,
)
from builder.core import engine
from builder.model import lockfile, matrix, platforms
from builder.stages import render

HERE = Path(__file__).resolve().parent
CPU_TORCH = "2.13.0+cpu"
CUDA_TORCH = "2.15.0"
PYTHON = "3.11"
EXTRA_PACKAGE = "six"


# ---------------------------------------------------------------- the sections


def section_sizes(res: Results, m: matrix.Matrix, torch: str, flavors: list[str],
                  naive_key: str) -> None:
    """1. Size per flavor vs the naive image (also the naive cold build time)."""
    variants = {v.flavor: v for v in m.variants if v.torch == torch and v.python == PYTHON
                and v.flavor in flavors and v.platform == platforms.DEFAULT}
    select = [f"torch={torch}", f"python={PYTHON}"]
    log(f"building {sorted(v.id for v in variants.values())} (no-op when up to date)")
    for flavor in flavors:
        build([*select, f"flavor={flavor}"])
    any_variant = next(iter(variants.values()))
    prune_builder_cache(keep_wheels=True)  # the naive build uses no cache; keep ours warm
    log(f"naive cold build of torch {torch} py{PYTHON}")
    nb = naive.build(torch, PYTHON, any_variant.find_links,
                     ROOT / ".state" / "logs" / f"bench-naive-{naive_key}.log")
    try:
        res.details.setdefault("naive", {})[naive_key] = {
            "dockerfile": nb.dockerfile, "seconds": round(nb.seconds, 1), "size": nb.size}
        res.details.setdefault("naive_seconds", {})[naive_key] = nb.seconds
        for flavor in flavors:
            v = variants[flavor]
            ref = image_ref(m, v.id)
            size = image_size(ref)
            res.details.setdefault("images", {})[v.id] = ref
            res.add(Figure(f"size {v.id}", _mb(size), "MB", _mb(nb.size),
                           _ratio(size, nb.size), "ours/naive"))
            if flavor == "slim":
                top = du_top(ref)
                res.details.setdefault("slim_du", {})[v.id] = top
                for kib, path in reversed(top[-5:]):
                    log(f"  slim {v.id}: {kib / 1024:.0f} MiB {path}")
        naive_top = du_top(nb.tag, paths=("/opt", "/usr", "/v"))
        res.details.setdefault("naive_du", {})[naive_key] = naive_top
    finally:
        naive.remove(nb.tag)


def section_build_times(res: Results, m: matrix.Matrix, variant_id: str, naive_key: str,
                        empty_wheelhouse: bool) -> None:
    """2. Cold build, cold build with an empty wheelhouse, warm no-op."""
    naive_s = res.details.get("naive_seconds", {}).get(naive_key)
    prune_builder_cache(keep_wheels=True)
    kept = wheel_cache_kept()
    seconds, outcomes = build([f"id={variant_id}"], "--force")
    built = [o for o in outcomes if o.get("state") == "built"]
    res.add(Figure(f"cold build {variant_id} (wheels on the host)", round(seconds, 1), "s",
                   round(naive_s, 1) if naive_s else None,
                   _ratio(seconds, naive_s) if naive_s else None,
                   "ours/naive; builder cache pruned except the wheel cache mount ("
                   + ("kept" if kept else "ABSENT: someone pruned it") + f"), --force; "
                   f"{len(built)} built" + wait_note()))
    if empty_wheelhouse:
        with tempfile.TemporaryDirectory(prefix="bench-state-", dir=ROOT / ".state") as tmp:
            prune_builder_cache()
            seconds, outcomes = build([f"id={variant_id}"], "--force",
                                      env={"BUILDER_STATE": tmp})
            res.add(Figure(f"cold build {variant_id} (empty wheel cache)", round(seconds, 1), "s",
                           round(naive_s, 1) if naive_s else None,
                           _ratio(seconds, naive_s) if naive_s else None,
                           "ours/naive; whole builder cache pruned (wheel cache mount too), "
                           "fresh BUILDER_STATE: every wheel fetched from PyPI" + wait_note()))
    seconds, outcomes = build([f"id={variant_id}"])
    states = [o.get("state") for o in outcomes]
    res.details["warm_noop_states"] = states
    res.add(Figure(f"warm no-op build {variant_id}", round(seconds, 1), "s",
                   note=f"built {states.count('built')} of {len(states)}: "
                   + ", ".join(str(s) for s in states) + wait_note()))


def section_incremental(res: Results, m: matrix.Matrix, torch: str) -> None:
    """2b. Add one package to one variant via include; rebuild the selection."""
    select = [f"torch={torch}", f"python={PYTHON}", f"platform={platforms.DEFAULT}"]
    selected = [v for v in m.variants if v.torch == torch and v.python == PYTHON
                and v.platform == platforms.DEFAULT]
    target = next(v for v in selected if v.flavor == "runtime")
    before = {v.id: image_id(image_ref(m, v.id)) for v in selected}
    refs = {v.id: image_ref(m, v.id) for v in selected}
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    entry = next((e for e in data.get("include", [])
                  if str(e.get("torch")) == target.torch and str(e.get("python")) == PYTHON
                  and e.get("flavor") == "runtime"), None)
    if entry is None:
        entry = {"torch": target.torch, "python": PYTHON, "flavor": "runtime",
                 "accelerator": target.accelerator}
        data.setdefault("include", []).append(entry)
    entry["packages"] = [*entry.get("packages", []), EXTRA_PACKAGE]
    new_ids: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="bench-incr-") as tmp:
        tmatrix = Path(tmp) / "matrix.yaml"
        tmatrix.write_text(yaml.safe_dump(data, sort_keys=False))
        tlocks = Path(tmp) / "locks"
        shutil.copytree(ROOT / "locks", tlocks)
        sel = [a for s in select for a in ("--select", s)]
        lock_s, _, _ = builder_cli("lock", "--matrix", str(tmatrix), "--locks", str(tlocks), *sel)
        try:
            seconds, outcomes = build(select, "--matrix", str(tmatrix), "--locks", str(tlocks))
            rebuilt = [o["variant_id"] for o in outcomes if o.get("state") == "built"]
            new_ids = {o["image_id"] for o in outcomes if o.get("image_id")}
            res.details["incremental"] = {"rebuilt": rebuilt, "lock_seconds": round(lock_s, 1),
                                          "states": {o["variant_id"]: o["state"]
                                                     for o in outcomes}}
            res.add(Figure(f"incremental (+{EXTRA_PACKAGE} on {target.id})", round(seconds, 1),
                           "s", note=f"rebuilt {len(rebuilt)} of {len(outcomes)} variants "
                           f"({', '.join(rebuilt) or 'none'}); lock took {lock_s:.1f} s"
                           + wait_note()))
        finally:
            for vid, old in before.items():  # point the floating tags back at the shipped images
                if old:
                    engine.docker("tag", old, refs[vid], check=False)
            for new in new_ids - set(before.values()):
                engine.remove_image(new)


def section_sharing(res: Results, m: matrix.Matrix, variant_ids: list[str]) -> None:
    """3. Sum of image sizes vs unique layer bytes (uncompressed)."""
    refs = [res.details["images"][vid] for vid in variant_ids if vid in res.details["images"]]
    share = layers.sharing(refs)
    res.details["sharing"] = share
    res.add(Figure(f"unique layer bytes of {len(refs)} images", _mb(share["unique_bytes"]), "MB",
                   _mb(share["sum_of_sizes"]), _ratio(share["unique_bytes"],
                                                      share["sum_of_sizes"]),
                   "baseline: sum of image sizes" + ("" if share["exact"]
                                                     else "; layer sizes approximate")))


def section_registry(res: Results, variant_ids: list[str]) -> None:
    """3b. What a registry stores for the images of one torch+python: its blobs after a push."""
    refs = [res.details["images"][vid] for vid in variant_ids if vid in res.details["images"]]
    reg = layers.registry_bytes(refs)
    res.details.setdefault("registry", {})[",".join(variant_ids)] = reg
    flavors = "+".join(vid.rsplit("-", 1)[1] for vid in variant_ids)
    res.add(Figure(f"registry bytes {variant_ids[0].rsplit('-', 1)[0]} {{{flavors}}}",
                   _mb(reg["registry_bytes"]), "MB", _mb(reg["sum_of_sizes"]),
                   _ratio(reg["registry_bytes"], reg["sum_of_sizes"]),
                   f"blobs in the registry's storage after pushing ({reg['blobs']} blobs, "
                   "compressed) / sum of image sizes"))


def section_sbom(res: Results, ref: str) -> None:
    """4. Our SBOM vs syft on the same image."""
    from bench.sbom_vs_syft import compare

    r = compare(ref)
    res.details.setdefault("sbom", {})[ref] = r
    s = r["seconds"]
    res.add(Figure(f"sbom time {ref}", s["ours"], "s", s["syft"], _ratio(s["ours"], s["syft"]),
                   "ours/syft"))
    mem = r["peak_mb"]
    res.add(Figure(f"sbom peak memory {ref}", mem["ours"], "MB", mem["syft"],
                   _ratio(mem["ours"], mem["syft"]), "ours/syft, peak RSS of each process"))
    ours = r["components"]["ours"]
    syft = r["components"]["syft"]
    for kind in sorted(set(ours) | set(syft)):
        res.add(Figure(f"sbom components {kind}", ours.get(kind, 0), "",
                       syft.get(kind, 0), _ratio(ours.get(kind, 0), syft.get(kind, 0)),
                       "ours vs syft"))
    res.add(Figure("sbom purls syft finds that we do not", len(r["missed_by_us"]), "",
                   note="must be 0" + (": " + ", ".join(r["missed_by_us"][:10])
                                       if r["missed_by_us"] else "")))
    res.add(Figure("sbom purls we add", len(r["added_by_us"]), "", note=", ".join(
        r["added_by_us"][:8]) + (" …" if len(r["added_by_us"]) > 8 else "")))


def section_plan_render(res: Results, m: matrix.Matrix, n_renders: int = 1000) -> None:
    """5. `builder plan --offline` of the shipped matrix; 1,000 renders in-process."""
    seconds, data, _ = builder_cli("plan", "--offline")
    n = len((data or {}).get("include", []))
    res.add(Figure(f"plan --offline ({n} variants)", round(seconds, 2), "s",
                   note="whole CLI process, python start-up included"))
    locks_dir = ROOT / "locks"
    shipped = [(v, lockfile.require_lock(locks_dir, v), lockfile.read_base_lock(locks_dir, v))
               for v in m.variants]
    render.render(m, *shipped[0])  # warm the template cache
    start = time.perf_counter()
    for i in range(n_renders):
        render.render(m, *shipped[i % len(shipped)])
    seconds = time.perf_counter() - start
    res.add(Figure(f"render x{n_renders} (shipped variants, in-process)", round(seconds, 2), "s",
                   note=f"{seconds / n_renders * 1e3:.2f} ms per variant"))


# ---------------------------------------------------------------- output



def write_outputs(res: Results) -> None:
    data = {"mode": res.mode, "machine": res.machine,
            "figures": [asdict(f) for f in res.figures], "details": res.details,
            "errors": res.errors}
    old = HERE / "results.json"
    kept = json.loads(old.read_text()) if old.exists() else {}
    for own in ("pull", "siblings"):  # `python -m bench pull` and `… siblings` write these
        if own in kept:
            data[own] = kept[own]
    (HERE / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["# Benchmark results", "",
             f"`python -m bench --{res.mode}` — generated by bench/runner.py; do not edit.", "",
             "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in res.machine.items()]
    lines += ["", "## Figures", "", *figure_table(res.figures, value=_fmt)]
    lines += ["", "## How it was measured", "",
              "- Naive baseline: the Dockerfile below, built with `DOCKER_BUILDKIT=1 --no-cache` "
              "after `docker builder prune -af`, from the same local base image; it is removed "
              "afterwards. It already uses `pip --no-cache-dir` and a bind mount for a local "
              "torch wheel, so it is a fair (not a strawman) baseline.",
              "- Ours: `python -m builder build --select id=… --force --no-smoke --no-sbom` after "
              "`docker builder prune -af`. *Wheels on the host*: every build-cache record is "
              "pruned except the wheel cache mount (uv's cache at `/mnt/build/cache`), the state "
              "after any earlier build; *empty wheel cache*: everything is pruned and "
              "`BUILDER_STATE` points at a fresh folder, so every wheel comes from PyPI. Times are "
              "wall clock of the whole CLI, measured in the same run as the naive build.",
              "- Sharing: unique layer bytes from `docker image inspect` diff ids paired with "
              "`docker history` sizes (uncompressed). Registry bytes: the images of one torch + "
              "python are pushed to a scratch `docker-registry`; the figure is the size of the "
              "blob files in its storage (compressed layers, configs) against the sum of the "
              "images' sizes.",
              "- Incremental: a copy of matrix.yaml adds one package to one variant through its "
              "include entry, locked into a copy of locks/; the floating tags are pointed back at "
              "the shipped images afterwards and the extra images removed.", ""]
    for key, nb in res.details.get("naive", {}).items():
        lines += [f"### Naive Dockerfile ({key})", "", "```dockerfile", nb["dockerfile"].rstrip(),
                  "```", ""]
    for vid, top in res.details.get("slim_du", {}).items():
        lines += [f"### Where the bytes of {vid} go (du -x -d 3 /opt /usr, KiB)", "", "```"]
        lines += [f"{kib:>10}  {path}" for kib, path in top]
        lines += ["```", ""]
    for key, top in res.details.get("naive_du", {}).items():
        lines += [f"### Naive image {key} (du -x -d 3 /opt /usr /v, KiB)", "", "```"]
        lines += [f"{kib:>10}  {path}" for kib, path in top]
        lines += ["```", ""]
    for ref, r in res.details.get("sbom", {}).items():
        lines += [f"### SBOM of {ref}", "",
                  f"- purls in common: {r['common']}",
                  f"- missed by us ({len(r['missed_by_us'])}): "
                  + (", ".join(r["missed_by_us"]) or "none"),
                  f"- added by us ({len(r['added_by_us'])}): "
                  + (", ".join(r["added_by_us"][:30]) or "none")
                  + (" …" if len(r["added_by_us"]) > 30 else ""), ""]
    if res.errors:
        lines += ["## Errors", ""] + [f"- {e.splitlines()[0]}" for e in res.errors] + [""]
    (HERE / "RESULTS.md").write_text("\n".join(lines))


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CPU torch only (default)")
    mode.add_argument("--full", action="store_true", help="add the CUDA torch 2.15.0")
    parser.add_argument("--no-empty-wheelhouse", action="store_true",
                        help="skip the cold build with an empty wheel cache")
    parser.add_argument("--no-sbom", action="store_true", help="skip our SBOM against syft")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    res = Results("full" if args.full else "quick")
    res.machine = machine_facts()
    m = matrix.load(ROOT / "matrix.yaml")

    def attempt(name: str, fn, *a) -> None:
        try:
            fn(*a)
        except Exception as exc:  # one failed section must not lose the others' figures
            res.errors.append(f"{name}: {exc}")
            log(f"{name} FAILED: {exc}")
            traceback.print_exc(file=sys.stderr)
        write_outputs(res)

    cpu_flavors = ["runtime", "slim"]
    cpu_ids = [v.id for v in m.variants if v.torch == CPU_TORCH and v.python == PYTHON
               and v.flavor in cpu_flavors]
    cpu_runtime = next(i for i in cpu_ids if i.endswith("-runtime"))
    attempt("sizes cpu", section_sizes, res, m, CPU_TORCH, cpu_flavors, "cpu")
    built_ids = list(cpu_ids)
    if args.full:
        cuda_flavors = ["runtime", "slim", "devel"]
        engine.ensure_disk(ROOT, 20)  # naive CUDA image + ours (runtime, slim, devel share layers)
        attempt("sizes cuda", section_sizes, res, m, CUDA_TORCH, cuda_flavors, "cuda")
        cuda_ids = [v.id for v in m.variants if v.torch == CUDA_TORCH and v.python == PYTHON
                    and v.flavor in cuda_flavors and v.platform == platforms.DEFAULT]
        built_ids += cuda_ids
        cold_id, naive_key, incr_torch = (next(i for i in cuda_ids if i.endswith("-runtime")),
                                          "cuda", CUDA_TORCH)
    else:
        cold_id, naive_key, incr_torch = cpu_runtime, "cpu", CPU_TORCH
    # Sharing first: the flavors as one build made them (the cold builds below rebuild one).
    attempt("sharing", section_sharing, res, m, built_ids)
    one_python = cuda_ids if args.full else cpu_ids
    attempt("registry", section_registry, res, one_python)
    attempt("build times", section_build_times, res, m, cold_id, naive_key,
            not args.no_empty_wheelhouse)
    attempt("incremental", section_incremental, res, m, incr_torch)
    sbom_refs = [res.details.get("images", {}).get(cpu_runtime)]
    if args.full:
        sbom_refs.append(res.details.get("images", {}).get(cold_id))
    for ref in filter(None, [] if args.no_sbom else sbom_refs):
        attempt(f"sbom {ref}", section_sbom, res, ref)
    attempt("plan/render", section_plan_render, res, m)
    log(f"wrote {HERE / 'results.json'} and {HERE / 'RESULTS.md'}")
    return 1 if res.errors else 0
