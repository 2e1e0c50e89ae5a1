"""`python -m bench reproduce`: reproducible images and what a rebuild costs a node, one run.

Each build starts from an empty engine: every image (the bench's, the bootstrapped base, any
other) and the whole BuildKit cache (wheel cache mount included) are removed before it, so
nothing of an earlier build is reused but what the bench registry holds. Runs on the engine
DOCKER_HOST names: point it at an engine of its own (it removes that engine's images and build
cache). Per variant (by default the
CPU runtime, then the CUDA runtime):

  A  build, smoke, SBOM, stage and publish the variant (the published image)
  B  empty engine, rebuild without the registry's cache → same diff ids? same digest?
  C  empty engine, rebuild again                        → same digest again?
  D  empty engine, CI-style cold build with the registry cache and the signed base A kept
     there (time / B's time; B bootstraps the base)
  E  one package one patch release older (numpy), empty engine, with the registry cache
     → new blob bytes a node holding A downloads
  F  the base with one file changed (a stand-in for one upgraded package), empty engine,
     with the registry cache → new blob bytes
  G  the naive Dockerfile (bench/naive.py) and ours, each cold (whole BuildKit cache pruned,
     its base image present as a pulled one would be, no registry, not staged) → time ratio

Writes bench/reproduce.json and bench/REPRODUCE.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import naive
from bench.figures import Figure, Results, _mb, _ratio, figure_table
from bench.harness import builder_cli, log, prune_builder_cache
from bench.layers import free_port
from builder.core import engine, layerdiff, oci, registry, reproducible
from builder.model import bases, matrix
from builder.stages import base

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
VARIANTS = ("2.13.0-py3.11-cpu-runtime", "2.15.0-py3.11-cuda-runtime")
BUMPED = "numpy"
KEY_ENV = {"COSIGN_PASSWORD": ""}


def label(variant: matrix.Variant) -> str:
    """`CPU runtime` / `CUDA runtime`: how the figures name the variant."""
    return f"{'CUDA' if variant.accelerator == 'cuda' else 'CPU'} {variant.flavor}"


def bench_matrix(folder: Path, addr: str, packages: list[str] | None = None) -> Path:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["registry"] = addr
    data.setdefault("exclude", []).append({"platform": "linux/arm64"})
    if packages is not None:
        data["packages"] = packages
    path = folder / ("matrix.yaml" if packages is None else "matrix-bumped.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def empty_engine(addr: str, suite: str) -> None:
    """What a fresh CI runner has: no image at all (another image with the same layers, such as
    a published copy of this variant, would let a build skip downloading them), no BuildKit
    cache. The bench's images and the base go by name, then every image not in use."""
    refs = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    for ref in refs:
        if ref.startswith((f"{addr}/", f"{bases.bootstrap_ref(suite)}")):
            engine.remove_image(ref)
    engine.docker("image", "prune", "-af")
    engine.docker("builder", "prune", "-af", timeout=1800)


def bench_key(folder: Path) -> Path:
    """The bench's throw-away cosign key (empty password), made once in `folder`: staged
    builds sign with it, so the base is kept signed in the bench registry and a build with the
    registry takes it from there verified (`--no-registry-cache` builds bootstrap it)."""
    key = folder / "key" / "cosign.key"
    if not key.exists():
        key.parent.mkdir(exist_ok=True)
        builder_cli("keygen", "--out", str(key.parent), env=KEY_ENV)
    return key


def build(mpath: Path, variant: str, *extra: str, evidence: bool = False, stage: bool = True
          ) -> tuple[float, dict[str, Any]]:
    """`builder build --stage --key` of the variant (smoke and SBOM only for the published
    one); (seconds, its outcome)."""
    checks = () if evidence else ("--no-smoke", "--no-sbom")
    staged = ("--stage", "--key", str(bench_key(mpath.parent))) if stage else ()
    os.sync()  # the last build's dirty pages are written back before this one is timed
    seconds, data, stderr = builder_cli("build", "--matrix", str(mpath), "--select",
                                        f"id={variant}", "--select", "platform=linux/amd64",
                                        "--force", *staged, *checks, *extra, env=KEY_ENV)
    [outcome] = data
    # builder.stages.build retries an export of cached layers that Docker 20.10 failed
    outcome["retries"] = [line.strip() for line in stderr.splitlines()
                          if "building again" in line]
    outcome["base_lines"] = [line.strip() for line in stderr.splitlines()
                             if line.startswith("base ")]
    if outcome["state"] != "built":
        raise RuntimeError(f"build failed: {outcome.get('message')}")
    return seconds, outcome


def base_way(outcome: dict[str, Any]) -> str:
    """How the build got its base: its `base …:` line (builder.flows.bases), up to the keys."""
    line = outcome["base_lines"][0] if outcome["base_lines"] else "no base line"
    return line.split(": ", 1)[-1].split(", its signature")[0]


def retried(outcome: dict[str, Any]) -> str:
    """A figure's note on the export retries of its build (Docker 20.10's lazy-layer bug)."""
    return f"; export retried: {'; '.join(outcome['retries'])}" if outcome["retries"] else ""


def staged_digest(outcome: dict[str, Any]) -> str:
    return outcome["message"].rsplit("@", 1)[1]  # stage_outcome: the staged reference


def diff_ids(image_id: str) -> list[str]:
    return (engine.inspect_image(image_id) or {}).get("RootFS", {}).get("Layers", [])


def same_layers(a: list[str], b: list[str]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=False))


def older_patch(lock_text: str, name: str) -> str:
    """`name==X.Y.(Z-1)` from the lock's pin (the bench's one-package change)."""
    pin = re.search(rf"^{name}==(\d+)\.(\d+)\.(\d+)", lock_text, re.M)
    if not pin or int(pin.group(3)) == 0:
        raise RuntimeError(f"the lock pins no {name}==X.Y.Z with Z > 0")
    major, minor, patch = pin.groups()
    return f"{name}=={major}.{minor}.{int(patch) - 1}"


def changed_base(suite: str) -> str:
    """The bootstrapped base with one file changed, loaded as today's base (one layer, like
    a re-bootstrap that upgraded one package); returns its digest."""
    base.bootstrap(suite)
    ref = bases.bootstrap_ref(suite)
    with engine.container(ref) as cid, tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        with engine.export(cid) as stream, tar.open("wb") as out:
            shutil.copyfileobj(stream, out)
        patched = Path(tmp) / "patched.tar"
        _patch_rootfs(tar, patched)
        reproducible.load_rootfs(patched, ref, "mmdebstrap + one changed file (bench)", ["bash"])
    engine.docker("tag", ref, f"{ref}-{base.bootstrap_key(suite, options=base.SLIM_OPTIONS)}")
    return base.digest_of(engine.inspect_image(ref) or {})


def _patch_rootfs(src: Path, dst: Path) -> None:
    with tarfile.open(src) as tin, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            data = tin.extractfile(member) if member.isfile() else None
            if member.name.lstrip("./") == "etc/debian_version" and data is not None:
                body = data.read() + b"# bench: a changed base\n"
                member.size = len(body)
                tout.addfile(member, io.BytesIO(body))
            else:
                tout.addfile(member, data)


def measure(res: Results, addr: str, tmp: Path, variant_id: str,
            deltas_only: bool = False) -> None:
    """Figures A-G of one variant."""
    mpath = bench_matrix(tmp, addr)
    m = matrix.load(mpath)
    variant = m.variant(variant_id)
    name, suite = label(variant), variant.base.bootstrap_suite or "bookworm"
    reg = oci.Registry(addr)
    staging = f"{m.repository}-staging"

    # A: the published image (--deltas-only: staged, the image E and F are compared with)
    empty_engine(addr, suite)
    if deltas_only:
        seconds_a, a = build(mpath, variant_id, "--no-registry-cache")
        measure_deltas(res, m, tmp, variant_id, suite, staged_digest(a), {"A": seconds_a})
        return
    seconds_a, a = build(mpath, variant_id, "--no-registry-cache", evidence=True)
    builder_cli("publish", "--matrix", str(mpath), "--select", f"id={variant_id}", "--select",
                "platform=linux/amd64", "--manifest", str(tmp / "published.json"), "--unsigned",
                "--allow-cpu-smoke")  # no GPU on a bench host: what is measured is the bytes
    pub = json.loads((tmp / "published.json").read_text())["variants"][variant_id]
    digest_a, layers_a = pub["publications"][-1]["digest"], diff_ids(a["image_id"])

    # B, C: the same commit, lock and base on an empty engine, no registry cache
    runs = []
    for _ in range(2):
        empty_engine(addr, suite)
        seconds, out = build(mpath, variant_id, "--no-registry-cache")
        runs.append((seconds, staged_digest(out), diff_ids(out["image_id"])))
    (seconds_b, digest_b, layers_b), (_, digest_c, layers_c) = runs
    res.add(Figure(f"layers with the same diff id after a rebuild on an empty engine ({name})",
                   f"{same_layers(layers_a, layers_b)}/{len(layers_a)}",
                   note=f"second rebuild: {same_layers(layers_a, layers_c)}/{len(layers_a)}"))
    res.add(Figure(f"image digest after that rebuild ({name})",
                   "identical, twice in a row" if digest_a == digest_b == digest_c
                   else "different",
                   note=f"published {digest_a[:19]}, rebuilds {digest_b[:19]}, {digest_c[:19]}"))

    # D: CI-style cold build with the registry's cache
    empty_engine(addr, suite)
    seconds_d, d = build(mpath, variant_id)
    new_d = layerdiff.delta(reg, staging, digest_a, staged_digest(d))[0]
    res.add(Figure(f"cold CI-style build on an empty engine, registry reachable / without it "
                   f"({name})", round(seconds_d, 1), "s", round(seconds_b, 1),
                   _ratio(seconds_d, seconds_b),
                   note=f"same digest as published: {staged_digest(d) == digest_a}; new blob "
                   f"bytes: {new_d}; without it the base is bootstrapped, with it the signed "
                   f"base is taken from the registry ({base_way(d)}); both include staging"
                   + retried(d)))
    details = res.details.setdefault(variant_id, {})
    details["unchanged_rebuild_new_bytes"] = new_d
    details["digests"] = {"A": digest_a, "B": digest_b, "C": digest_c, "D": staged_digest(d)}
    measure_deltas(res, m, tmp, variant_id, suite, digest_a,
                   {"A": seconds_a, "B": seconds_b, "D": seconds_d})
    measure_naive(res, m, variant_id, mpath)


def measure_deltas(res: Results, m: matrix.Matrix, tmp: Path, variant_id: str, suite: str,
                   digest_a: str, seconds: dict[str, float]) -> None:
    """E and F: what a node holding A downloads after a one-package and a base-only change."""
    reg, staging, mpath = oci.Registry(m.registry), f"{m.repository}-staging", tmp / "matrix.yaml"
    name = label(m.variant(variant_id))
    # E: one package one patch release older, with the registry cache
    lock_text = (ROOT / "locks" / f"{variant_id}.txt").read_text()
    pin = older_patch(lock_text, BUMPED)
    listed = yaml.safe_load((ROOT / "matrix.yaml").read_text()).get("packages") or [BUMPED]
    packages = [pin if p == BUMPED else p for p in listed]
    bumped = bench_matrix(tmp, m.registry, packages)
    locks = tmp / "locks"
    shutil.copytree(ROOT / "locks", locks, dirs_exist_ok=True)
    builder_cli("lock", "--matrix", str(bumped), "--select", f"id={variant_id}", "--select",
                "platform=linux/amd64", "--locks", str(locks))
    empty_engine(m.registry, suite)
    seconds_e, e = build(bumped, variant_id, "--locks", str(locks))
    new_e, total_e = layerdiff.delta(reg, staging, digest_a, staged_digest(e))
    res.add(Figure(f"new blob bytes a node downloads after a one-package change ({pin}), "
                   f"rebuilt on an empty engine ({name})", _mb(new_e), "MB", _mb(total_e),
                   _ratio(new_e, total_e), note=f"build {seconds_e:.0f} s with the registry "
                   "cache" + retried(e)))

    # F: a changed base (one file), with the registry cache
    empty_engine(m.registry, suite)
    changed_base(suite)
    seconds_f, f = build(mpath, variant_id)
    new_f, total_f = layerdiff.delta(reg, staging, digest_a, staged_digest(f))
    manifest_f = json.loads((reg.manifest(staging, staged_digest(f)) or (b"{}", None))[0])
    base_layer = int((manifest_f.get("layers") or [{}])[0].get("size") or 0)
    res.add(Figure(f"new blob bytes after a base-only change (one file of the base changed), "
                   f"{name}", _mb(new_f), "MB", _mb(base_layer), _ratio(new_f, base_layer),
                   note=f"baseline: the base layer; image {_mb(total_f)} MB; goal ≤ base + 5% "
                   f"of the image ({_mb(base_layer + total_f // 20)} MB)" + retried(f)))
    details = res.details.setdefault(variant_id, {})
    details.setdefault("digests", {"A": digest_a}).update(E=staged_digest(e), F=staged_digest(f))
    details["seconds"] = {**seconds, "E": seconds_e, "F": seconds_f}
    empty_engine(m.registry, suite)


def measure_naive(res: Results, m: matrix.Matrix, variant_id: str, mpath: Path) -> None:
    """G: ours and the naive Dockerfile, each cold with its base present (as a pulled
    `debian:bookworm` would be), the whole BuildKit cache pruned, no registry, not staged."""
    variant = m.variant(variant_id)
    suite = variant.base.bootstrap_suite or "bookworm"
    empty_engine(m.registry, suite)
    base.bootstrap(suite)
    naive_log = ROOT / ".state" / "logs" / f"bench-reproduce-naive-{variant_id}.log"
    os.sync()
    nb = naive.build(variant.torch, variant.python, variant.find_links, naive_log)
    naive.remove(nb.tag)
    prune_builder_cache()
    seconds, _ = build(mpath, variant_id, "--no-registry-cache", stage=False)
    res.add(Figure(f"cold build, {label(variant)} / naive Dockerfile, same run",
                   round(seconds, 1), "s", round(nb.seconds, 1), _ratio(seconds, nb.seconds),
                   note="both: whole BuildKit cache pruned, base image present, no registry, "
                   f"not staged; naive image {_mb(nb.size)} MB"))
    res.details.setdefault(variant_id, {})["naive_seconds"] = nb.seconds
    empty_engine(m.registry, suite)


def write_outputs(res: Results) -> None:
    data = {"machine": res.machine, "figures": [f.__dict__ for f in res.figures],
            "details": res.details, "errors": res.errors}
    (HERE / "reproduce.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["# Reproducible images: results", "",
             "`python -m bench reproduce` — generated by bench/reproduce.py; do not edit.", "",
             f"Run {res.machine.get('started')} on {res.machine.get('cpus')} cores, variants "
             f"{', '.join(res.machine.get('variants', []))}; load average before the run: "
             f"{res.machine.get('load')}.", "",
             *figure_table(res.figures, ratio_digits=3)]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"- {e.splitlines()[0]}" for e in res.errors]
    (HERE / "REPRODUCE.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench reproduce",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", metavar="ID",
                        help=f"a variant to measure (repeatable; default: {', '.join(VARIANTS)})")
    parser.add_argument("--deltas-only", action="store_true",
                        help="only the one-package and base-only rebuild deltas (E, F)")
    args = parser.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    os.chdir(ROOT)
    engine.ensure_disk(ROOT, 25)  # a CUDA image, the naive one and the registry's copies
    res = Results("reproduce")
    res.machine = {"engine": engine.engine_address(), "started": time.strftime("%FT%TZ"),
                   "cpus": os.cpu_count(), "load": os.getloadavg()[0], "variants": variants}
    with tempfile.TemporaryDirectory(prefix="bench-reproduce-") as tmp:
        addr = f"127.0.0.1:{free_port()}"
        registry.start(addr, Path(tmp) / "registry")
        try:
            for variant_id in variants:
                log(f"variant {variant_id}")
                try:
                    measure(res, addr, Path(tmp), variant_id, args.deltas_only)
                except Exception as exc:  # the figures so far are still written
                    res.errors.append(f"{variant_id}: {exc}")
                    log(f"FAILED: {exc}")
                write_outputs(res)
        finally:
            registry.stop(Path(tmp) / "registry")
    log(f"wrote {HERE / 'reproduce.json'} and {HERE / 'REPRODUCE.md'}")
    return 1 if res.errors else 0
