"""`python -m bench reproduce`: reproducible images and what a rebuild costs a node, one run.

Each build starts from an empty engine: the bench's images, the bootstrapped base and the whole
BuildKit cache (wheel cache mount included) are removed before it, so nothing of an earlier
build is reused but what the bench registry holds. Runs on the engine DOCKER_HOST names: point
it at an engine of its own (it prunes that engine's build cache).

  A  build, smoke, SBOM, stage and publish the variant (the published image)
  B  empty engine, rebuild without the registry's cache → same diff ids? same digest?
  C  empty engine, rebuild again                        → same digest again?
  D  empty engine, CI-style cold build with the registry cache (time / B's time)
  E  one package one patch release older (numpy), empty engine, with the registry cache
     → new blob bytes a node holding A downloads
  F  the base with one file changed (a stand-in for one upgraded package), empty engine,
     with the registry cache → new blob bytes

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

from bench.layers import free_port
from bench.runner import Figure, Results, _mb, _ratio, builder_cli, figure_table, log
from builder.core import engine, layerdiff, oci, registry, reproducible
from builder.stages import base, matrix

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
VARIANT = "2.13.0-py3.11-cpu-runtime"
BUMPED = "numpy"


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
    """What a fresh CI runner has: no image of ours, no base, no BuildKit cache."""
    refs = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    for ref in refs:
        if ref.startswith((f"{addr}/", f"{base.bootstrap_ref(suite)}")):
            engine.remove_image(ref)
    engine.docker("image", "prune", "-f")
    engine.docker("builder", "prune", "-af", timeout=1800)


def build(mpath: Path, *extra: str, evidence: bool = False) -> tuple[float, dict[str, Any]]:
    """`builder build --stage` of the variant (smoke and SBOM only for the published one);
    (seconds, its outcome)."""
    checks = () if evidence else ("--no-smoke", "--no-sbom")
    seconds, data, _ = builder_cli("build", "--matrix", str(mpath), "--select", f"id={VARIANT}",
                                   "--force", "--stage", *checks, *extra)
    [outcome] = data
    if outcome["state"] != "built":
        raise RuntimeError(f"build failed: {outcome.get('message')}")
    return seconds, outcome


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
    ref = base.bootstrap_ref(suite)
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


def measure(res: Results, addr: str, tmp: Path, deltas_only: bool = False) -> None:
    mpath = bench_matrix(tmp, addr)
    m = matrix.load(mpath)
    suite = m.variant(VARIANT).base.bootstrap_suite or "bookworm"
    reg = oci.Registry(addr)
    staging = f"{m.repository}-staging"

    # A: the published image (--deltas-only: staged, the image E and F are compared with)
    empty_engine(addr, suite)
    if deltas_only:
        seconds_a, a = build(mpath, "--no-registry-cache")
        measure_deltas(res, m, tmp, addr, suite, staged_digest(a), {"A": seconds_a})
        return
    seconds_a, a = build(mpath, "--no-registry-cache", evidence=True)
    builder_cli("publish", "--matrix", str(mpath), "--select", f"id={VARIANT}",
                "--manifest", str(tmp / "published.json"), "--unsigned")
    pub = json.loads((tmp / "published.json").read_text())["variants"][VARIANT]
    digest_a, layers_a = pub["publications"][-1]["digest"], diff_ids(a["image_id"])

    # B, C: the same commit, lock and base on an empty engine, no registry cache
    runs = []
    for _ in range(2):
        empty_engine(addr, suite)
        seconds, out = build(mpath, "--no-registry-cache")
        runs.append((seconds, staged_digest(out), diff_ids(out["image_id"])))
    (seconds_b, digest_b, layers_b), (_, digest_c, layers_c) = runs
    res.add(Figure("layers with the same diff id after a rebuild on an empty engine (CPU "
                   "runtime)", f"{same_layers(layers_a, layers_b)}/{len(layers_a)}",
                   note=f"second rebuild: {same_layers(layers_a, layers_c)}/{len(layers_a)}"))
    res.add(Figure("image digest after that rebuild",
                   "identical, twice in a row" if digest_a == digest_b == digest_c
                   else "different",
                   note=f"published {digest_a[:19]}, rebuilds {digest_b[:19]}, {digest_c[:19]}"))

    # D: CI-style cold build with the registry's cache
    empty_engine(addr, suite)
    seconds_d, d = build(mpath)
    res.add(Figure("cold CI-style build on an empty engine, registry reachable / without it",
                   round(seconds_d, 1), "s", round(seconds_b, 1), _ratio(seconds_d, seconds_b),
                   note=f"same digest as published: {staged_digest(d) == digest_a}; both "
                   "include the base bootstrap and staging"))
    res.details["unchanged_rebuild_new_bytes"] = layerdiff.delta(
        reg, staging, digest_a, staged_digest(d))[0]
    res.details["digests"] = {"A": digest_a, "B": digest_b, "C": digest_c,
                              "D": staged_digest(d)}
    measure_deltas(res, m, tmp, addr, suite, digest_a,
                   {"A": seconds_a, "B": seconds_b, "D": seconds_d})


def measure_deltas(res: Results, m: matrix.Matrix, tmp: Path, addr: str, suite: str,
                   digest_a: str, seconds: dict[str, float]) -> None:
    """E and F: what a node holding A downloads after a one-package and a base-only change."""
    reg, staging, mpath = oci.Registry(addr), f"{m.repository}-staging", tmp / "matrix.yaml"
    # E: one package one patch release older, with the registry cache
    lock_text = (ROOT / "locks" / f"{VARIANT}.txt").read_text()
    pin = older_patch(lock_text, BUMPED)
    listed = yaml.safe_load((ROOT / "matrix.yaml").read_text()).get("packages") or [BUMPED]
    packages = [pin if p == BUMPED else p for p in listed]
    bumped = bench_matrix(tmp, addr, packages)
    locks = tmp / "locks"
    shutil.copytree(ROOT / "locks", locks, dirs_exist_ok=True)
    builder_cli("lock", "--matrix", str(bumped), "--select", f"id={VARIANT}", "--locks",
                str(locks))
    empty_engine(addr, suite)
    seconds_e, e = build(bumped, "--locks", str(locks))
    new_e, total_e = layerdiff.delta(reg, staging, digest_a, staged_digest(e))
    res.add(Figure(f"new blob bytes a node downloads after a one-package change ({pin}), "
                   "rebuilt on an empty engine (CPU runtime)", _mb(new_e), "MB", _mb(total_e),
                   _ratio(new_e, total_e), note=f"build {seconds_e:.0f} s with the registry "
                   "cache"))

    # F: a changed base (one file), with the registry cache
    empty_engine(addr, suite)
    changed_base(suite)
    seconds_f, f = build(mpath)
    new_f, total_f = layerdiff.delta(reg, staging, digest_a, staged_digest(f))
    manifest_f = json.loads((reg.manifest(staging, staged_digest(f)) or (b"{}", None))[0])
    base_layer = int((manifest_f.get("layers") or [{}])[0].get("size") or 0)
    res.add(Figure("new blob bytes after a base-only change (one file of the base changed), "
                   "CPU runtime", _mb(new_f), "MB", _mb(base_layer), _ratio(new_f, base_layer),
                   note=f"baseline: the base layer; image {_mb(total_f)} MB; goal ≤ base + 5% "
                   "of the image"))
    res.details.setdefault("digests", {"A": digest_a}).update(E=staged_digest(e),
                                                              F=staged_digest(f))
    res.details["seconds"] = {**seconds, "E": seconds_e, "F": seconds_f}
    empty_engine(addr, suite)


def write_outputs(res: Results) -> None:
    data = {"machine": res.machine, "figures": [f.__dict__ for f in res.figures],
            "details": res.details, "errors": res.errors}
    (HERE / "reproduce.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["# Reproducible images: results", "",
             "`python -m bench reproduce` — generated by bench/reproduce.py; do not edit.", "",
             *figure_table(res.figures, ratio_digits=3)]
    lines += ["", "Not measured in this run: the CUDA runtime figures (a CUDA build takes too "
              "long on this 2-core machine for the session), and cold CUDA build / naive."]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"- {e.splitlines()[0]}" for e in res.errors]
    (HERE / "REPRODUCE.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench reproduce",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas-only", action="store_true",
                        help="only the one-package and base-only rebuild deltas (E, F)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    engine.ensure_disk(ROOT, 15)
    res = Results("reproduce")
    res.machine = {"engine": engine.engine_address(), "started": time.strftime("%FT%TZ")}
    with tempfile.TemporaryDirectory(prefix="bench-reproduce-") as tmp:
        addr = f"127.0.0.1:{free_port()}"
        registry.start(addr, Path(tmp) / "registry")
        try:
            measure(res, addr, Path(tmp), args.deltas_only)
        except Exception as exc:  # the figures so far are still written
            res.errors.append(str(exc))
            log(f"FAILED: {exc}")
        finally:
            write_outputs(res)
            registry.stop(Path(tmp) / "registry")
    log(f"wrote {HERE / 'reproduce.json'} and {HERE / 'REPRODUCE.md'}")
    return 1 if res.errors else 0
