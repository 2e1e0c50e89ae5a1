"""`python -m bench pull`: bytes to a node: containerd pulls the gzip tag and its zstd twin.

Per variant (default: the CPU runtime and the CUDA 13.2 slim), in one run:
  push     the local image into a source registry (`docker push`: the gzip layers as published;
           the registry's folder is kept in --work, so a second run pushes nothing)
  promote  into an empty registry by digest, then make the zstd twin there (builder.stages.twin),
           in a child process: the twin's added seconds and the process's peak RSS (VmHWM)
  cri      as a kubelet pulls (bench/cri.py): a private containerd with its CRI plugin, fresh each
           run (empty content store and snapshotter, and the page cache emptied first, as on a
           freshly booted node), `ImageService.PullImage` over gRPC, then
           `ctr run` (k8s.io) of `import torch` + a 2048² matmul; pull seconds, containerd
           CPU-seconds (its own and its children's), time to the first matmul, bytes fetched,
           load; alternating, min of 3; on each containerd of --containerd (bench/containerds.py;
           default: this machine's Go 1.19 build and Debian 13's Go 1.24 one, since the ratio a
           node sees depends on which it runs, Debian 13's again without unpigz, as a node
           with only the containerd package has none, and Debian unstable's containerd 2.x,
           whose CRI pulls through its transfer service)
  pull     `ctr images pull` against dockerd's own containerd, as a Kubernetes node pulls: a
           fresh namespace each time, the image and its content removed after (`--sync`),
           `sync` before each; gzip and zstd alternate (gz,zs then zs,gz …), min of --runs
  parts    where the time goes, each part alone: download (`ctr content fetch` into a fresh
           namespace: HTTP, the digest check, containerd's content store), unpack (the pull
           once the content is there: decompress, diff-id digest, write), decompression alone
           (`unpigz -dc`, as containerd runs it, and `zstd -dc`), sha256 of the compressed
           and the uncompressed bytes (`sha256sum`), and the floor: `tar -x` of the same
           uncompressed layers from local files into an empty folder
Writes bench/PULL.md and the `pull` entry of bench/results.json; the load average (1 min) is
recorded beside every timing. The machine's other work is not stopped: read the load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import containerds, cri, debian, promote, pullreport
from builder.core import oci, proc, registry, zstd
from builder.core.errors import BuilderError
from builder.stages import twin

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOCK = "/run/docker/containerd/containerd.sock"
VARIANTS = ("2.15.0-py3.11-cuda-slim", "2.13.0-py3.11-cpu-runtime")
DEFAULT_CONTAINERDS = ("system", "debian-13", "debian-13" + containerds.NO_UNPIGZ, "debian-sid")
SOURCE_REPO, REPO = "staging", "torch"


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def timed(argv: list[str], timeout: float = 3600) -> dict[str, float]:
    """Seconds of one command, with the 1-minute load average just before it."""
    before = load()
    start = time.monotonic()
    proc.run(argv, timeout=timeout)
    return {"s": round(time.monotonic() - start, 2), "load": before}


def sh(script: str, timeout: float = 3600) -> dict[str, float]:
    return timed(["bash", "-c", f"set -euo pipefail; {script}"], timeout)


def best(runs: list[dict[str, Any]], key: str = "s") -> dict[str, Any]:
    """The fastest run (least `key`), with every run's figures and loads kept beside it."""
    fastest = min(runs, key=lambda r: r[key])
    return {**fastest, "runs": runs}


def alternating(runs: int, measure: Callable[[str, int], dict[str, Any]]
                ) -> dict[str, list[dict[str, Any]]]:
    """`measure(kind, n)` for gzip and zstd, `runs` times each, the order flipped every run (so
    neither always goes first onto a machine the other warmed)."""
    timings: dict[str, list[dict[str, Any]]] = {"gzip": [], "zstd": []}
    for n in range(runs):
        for kind in turns(n, ["gzip", "zstd"]):
            timings[kind].append(measure(kind, n))
    return timings


def turns(n: int, items: list[Any]) -> list[Any]:
    """`items` in order on even runs, reversed on odd ones: none always goes first."""
    return items if n % 2 == 0 else items[::-1]


# ---- containerd -------------------------------------------------------------------------------


def ctr(namespace: str, *args: str, timeout: float = 3600) -> list[str]:
    return ["ctr", "--address", SOCK, "-n", namespace, *args]


def fresh_namespace() -> str:
    return f"bench-pull-{uuid.uuid4().hex[:10]}"


def remove_namespace(namespace: str, ref: str) -> None:
    """The image, then (synchronously) its content and snapshots, then the namespace."""
    proc.run(ctr(namespace, "images", "rm", "--sync", ref), check=False, timeout=600)
    left = proc.run(ctr(namespace, "content", "ls", "-q"), check=False).stdout.split()
    for digest in left:
        proc.run(ctr(namespace, "content", "rm", digest), check=False)
    proc.run(ctr(namespace, "namespaces", "rm", namespace), check=False)


def pull(ref: str) -> dict[str, float]:
    """One cold pull + unpack in a fresh namespace, removed after."""
    namespace = fresh_namespace()
    proc.run(["sync"])
    try:
        return timed(ctr(namespace, "images", "pull", "--plain-http", ref))
    finally:
        remove_namespace(namespace, ref)


def fetch_then_unpack(ref: str) -> dict[str, dict[str, float]]:
    """The pull in two parts: the content alone (`content fetch`), then the pull that finds
    the content there and only unpacks."""
    namespace = fresh_namespace()
    proc.run(["sync"])
    try:
        fetch = timed(ctr(namespace, "content", "fetch", "--plain-http", ref))
        proc.run(["sync"])
        unpack = timed(ctr(namespace, "images", "pull", "--plain-http", ref))
        return {"fetch": fetch, "unpack": unpack}
    finally:
        remove_namespace(namespace, ref)


def check_runs(ref: str, argv: list[str]) -> str:
    """What the image prints when containerd runs it (the twin must really be usable)."""
    namespace, name = fresh_namespace(), f"bench-{uuid.uuid4().hex[:6]}"
    runc_root = Path(tempfile.mkdtemp(prefix="bench-runc-", dir="/run"))  # not the shim's
    try:
        proc.run(ctr(namespace, "images", "pull", "--plain-http", ref))
        out = proc.run(ctr(namespace, "run", "--rm", "--runc-root", str(runc_root), ref, name,
                           *argv), timeout=600)
        return out.stdout.strip()
    finally:  # a run that timed out leaves its container: killed and deleted first
        cri.remove_containers(runc_root / namespace)
        proc.run(ctr(namespace, "tasks", "rm", "--force", name), check=False)
        proc.run(ctr(namespace, "containers", "rm", name), check=False)
        remove_namespace(namespace, ref)
        shutil.rmtree(runc_root, ignore_errors=True)


# ---- registries and the twin ------------------------------------------------------------------


def twin_worker(argv: list[str]) -> int:
    """`pull-twin SRC DST DIGEST`: promote, then make the twin; prints seconds and VmHWM."""
    source, target, digest = argv[:3]
    dst = oci.Registry(target)
    started = {"promote_load": load()}
    start = time.monotonic()
    oci.promote(oci.Registry(source), SOURCE_REPO, dst, REPO, digest)
    promoted = time.monotonic()
    hwm_promote = vm_hwm_mb()
    started["twin_load"] = load()
    report, cpu = twin.Report(), cpu_seconds()
    desc = twin.make(dst, REPO, digest, report=report)
    done, cpu = time.monotonic(), cpu_seconds() - cpu
    dst.tag(REPO, digest, "gzip")
    dst.tag(REPO, desc.digest, "zstd")
    print(json.dumps({**started, "promote_s": round(promoted - start, 1),
                      "twin_s": round(done - promoted, 1), "hwm_promote_mb": hwm_promote,
                      "hwm_mb": vm_hwm_mb(), "twin": desc.digest, "workers": zstd.threads(),
                      "twin_cpu_s": round(cpu, 1),
                      **report.as_json()}))
    return 0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, every thread's (zstd's workers too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def make_twin(source: str, target: str, digest: str) -> dict[str, Any]:
    out = proc.run([sys.executable, "-m", "bench", "pull-twin", source, target, digest],
                   cwd=ROOT, timeout=7200)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- one variant ------------------------------------------------------------------------------


def manifest_of(reg: oci.Registry, ref: str) -> dict[str, Any]:
    return json.loads(reg.manifest(REPO, ref)[0])  # type: ignore[index]


def served_blobs(reg: oci.Registry, ref: str, storage: Path) -> list[Path]:
    """The files the registry serves the image's config and layers from (distribution's
    filesystem driver: `docker/registry/v2/blobs/sha256/<2 hex>/<hex>/data`)."""
    doc = manifest_of(reg, ref)
    root = storage / "docker" / "registry" / "v2" / "blobs" / "sha256"
    return [root / d[7:9] / d[7:] / "data"
            for d in (doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"]))]


def local_blobs(reg: oci.Registry, digest: str, folder: Path) -> list[Path]:
    """The image's layer blobs as local files (for the parts measured alone)."""
    doc = manifest_of(reg, digest)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, layer in enumerate(doc["layers"]):
        path = folder / f"{n:02d}"
        with path.open("wb") as fh:
            for chunk in reg.stream_blob(REPO, layer["digest"], layer["size"]):
                fh.write(chunk)
        paths.append(path)
    return paths


def parts(gz: list[Path], zs: list[Path], work: Path, runs: int) -> dict[str, Any]:
    """Each part of an unpack alone, min of `runs`: decompression, sha256, the tar -x floor."""
    tars = work / "tars"
    tars.mkdir(parents=True, exist_ok=True)
    for path in gz:
        proc.run(["bash", "-c", f"unpigz -dc {path} > {tars / path.name}"], timeout=3600)
    tar_files = sorted(tars.iterdir())
    target = work / "floor"

    def floor() -> dict[str, float]:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        proc.run(["sync"])
        result = sh("; ".join(f"tar -x -f {t} -C {target}" for t in tar_files))
        result["sync_s"] = sh("sync")["s"]
        return result

    out = {
        "floor_tar_x": best([floor() for _ in range(runs)]),
        "unpigz_dc": best([sh("; ".join(f"unpigz -dc {p} > /dev/null" for p in gz))
                           for _ in range(runs)]),
        "zstd_dc": best([sh("; ".join(f"zstd -qdc {p} > /dev/null" for p in zs))
                         for _ in range(runs)]),
        "sha256_gzip": best([sh(f"sha256sum {' '.join(map(str, gz))} > /dev/null")]),
        "sha256_zstd": best([sh(f"sha256sum {' '.join(map(str, zs))} > /dev/null")]),
        "sha256_tar": best([sh(f"sha256sum {' '.join(map(str, tar_files))} > /dev/null")]),
        "tar_bytes": sum(t.stat().st_size for t in tar_files),
    }
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(tars, ignore_errors=True)
    return out


def cri_runs(vetted: str, refs: dict[str, str], runs: int, variant_id: str,
             nodes: list[containerds.Containerd], storage: Path) -> dict[str, Any]:
    """As a kubelet pulls (bench/cri.py), on each containerd: each run a fresh one, a CRI
    pull, the first matmul; within a run the containerds take turns going first, and so do
    gzip and zstd; per containerd the run with the least time to the first matmul is kept.
    The registry (in `storage`) serves each pull from memory, as a remote one with the image
    in its cache would: its files are read back after the node's page cache is emptied."""
    reg = oci.Registry(vetted)
    served = {kind: served_blobs(reg, ref.rsplit(":", 1)[1], storage)
              for kind, ref in refs.items()}
    timings: dict[str, dict[str, list[dict[str, Any]]]] = {
        node.name: {"gzip": [], "zstd": []} for node in nodes}
    for n in range(runs):
        for node in turns(n, nodes):
            for kind in turns(n, ["gzip", "zstd"]):
                log(f"{variant_id}: CRI pull + first matmul on {node.name}, {kind} "
                    f"(run {n + 1}/{runs}, load {load()})")
                timings[node.name][kind].append(
                    cri.cold_start(vetted, refs[kind], node=node, served=served[kind]))
    return {node.name: {"containerd": node.facts(),
                        **{kind: best(v, key="to_matmul_s")
                           for kind, v in timings[node.name].items()}} for node in nodes}


def variant(variant_id: str, source: str, vetted: str, work: Path, runs: int,
            run_check: list[str] | None, nodes: list[containerds.Containerd],
            cri_n: int = 3) -> dict[str, Any]:
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    local = image_of(variant_id)
    log(f"{variant_id}: docker push {local} into {source} (kept between runs)")
    digest = promote.push_local_image(source, SOURCE_REPO, local)
    log(f"{variant_id}: promote into {vetted}, then its zstd twin (child process)")
    made = make_twin(source, vetted, digest)
    gz_ref, zs_ref = f"{vetted}/{REPO}:gzip", f"{vetted}/{REPO}:zstd"

    def one(kind: str, n: int) -> dict[str, Any]:
        log(f"{variant_id}: pull {kind} (run {n + 1}/{runs}, load {load()})")
        return pull(gz_ref if kind == "gzip" else zs_ref)

    timings = alternating(runs, one)
    by_cri = cri_runs(vetted, {"gzip": gz_ref, "zstd": zs_ref}, cri_n, variant_id, nodes,
                      work / "vetted" / "storage")
    split = {kind: fetch_then_unpack(gz_ref if kind == "gzip" else zs_ref)
             for kind in ("gzip", "zstd")}
    reg = oci.Registry(vetted)
    log(f"{variant_id}: the parts alone (local blobs under {work})")
    gz = local_blobs(reg, digest, work / "gzip")
    zs = local_blobs(reg, made["twin"], work / "zstd")
    alone = parts(gz, zs, work, runs)
    shutil.rmtree(work / "gzip", ignore_errors=True)
    shutil.rmtree(work / "zstd", ignore_errors=True)
    ran = check_runs(zs_ref, run_check) if run_check else ""
    return {"id": variant_id, "started": started, "local_image": local, "gzip_digest": digest,
            "twin": made, "pull": {k: best(v) for k, v in timings.items()}, "split": split,
            "parts": alone, "twin_runs": ran, "cri": by_cri, "cri_runs": cri_n,
            "working_set": by_cri[nodes[0].name]["zstd"].get("working_set")}


def image_of(variant_id: str) -> str:
    out = proc.run([sys.executable, "-m", "builder", "plan", "--offline", "--json",
                    "--select", f"id={variant_id}", "--select", "platform=linux/amd64"],
                   cwd=ROOT, timeout=600)
    return json.loads(out.stdout)["include"][0]["image"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pull", description=__doc__)
    parser.add_argument("--variant", action="append", help=f"default: {', '.join(VARIANTS)}")
    parser.add_argument("--runs", type=int, default=2, help="pulls of each tag (min is kept)")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/bench-pull"),
                        help="the source registry's folder (kept), the containerd cache "
                        "(`containerd/<deb sha256>`, kept) and scratch space")
    parser.add_argument("--source-port", type=int, default=5035)
    parser.add_argument("--cri-runs", type=int, default=3,
                        help="CRI pulls + first matmul of each tag (min is kept)")
    parser.add_argument("--containerd", action="append", metavar="|".join(containerds.CHOICES),
                        help="a containerd the CRI runs measure, `:no-unpigz` after it to "
                        "disable unpigz (repeat for several; default: "
                        f"{', '.join(DEFAULT_CONTAINERDS)}, each one that cannot be had here "
                        "skipped with its reason)")
    parser.add_argument("--allow-expired-index", action="store_true",
                        help=f"accept a Debian index up to {debian.MAX_STALE.days} days past "
                        "its Valid-Until (a "
                        "frozen mirror's sid; apt's Acquire::Check-Valid-Until=false): still "
                        "signed by Debian, not its newest; the report names the date. Without "
                        "it a default containerd that needs it is skipped")
    parser.add_argument("--quick", action="store_true",
                        help=f"the CPU runtime only ({VARIANTS[1]})")
    args = parser.parse_args(argv)
    try:
        proc.which("ctr")
        cri.can_empty_page_cache()
        nodes = measured(args.containerd, args.work / "containerd", args.allow_expired_index)
        for node in nodes:
            log(f"containerd `{node.name}`: {node.version}, {node.go}; {node.source}")
        run(args, nodes)
    except BuilderError as exc:
        print(f"error: {exc}" + (f"\n\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return exc.exit_code
    return 0


def measured(specs: list[str] | None, cache: Path, allow_expired: bool
             ) -> list[containerds.Containerd]:
    """The containerds given, each required; without any, DEFAULT_CONTAINERDS, where one that
    cannot be had here (sid on a frozen mirror) is skipped with its one-line reason."""
    if specs:
        return [containerds.resolve(spec, cache, allow_expired) for spec in specs]
    nodes = []
    for spec in DEFAULT_CONTAINERDS:
        try:
            nodes.append(containerds.resolve(spec, cache, allow_expired))
        except BuilderError as exc:
            log(f"containerd `{spec}` skipped: {exc}" + (f" ({exc.hint})" if exc.hint else ""))
    if not nodes:
        raise BuilderError("no containerd to measure", hint="name one with --containerd")
    return nodes


def run(args: argparse.Namespace, nodes: list[containerds.Containerd]) -> None:
    """Each variant in turn, bench/PULL.md and results.json rewritten after each."""
    source = f"127.0.0.1:{args.source_port}"
    registry.start(source, args.work / "src")
    vetted = f"127.0.0.1:{pullreport.free_port()}"
    scratch = args.work / f"run-{uuid.uuid4().hex[:8]}"
    registry.start(vetted, scratch / "vetted")
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = []
    try:
        for vid in args.variant or (VARIANTS[1:] if args.quick else VARIANTS):
            check = ["python", "-c", "import torch; print(torch.__version__)"]
            results.append(variant(vid, source, vetted, scratch, args.runs, check, nodes,
                                   args.cri_runs))
            pullreport.write(results, started, args.runs, HERE)  # each variant as it is done
    finally:  # the source registry's folder is kept for the next run, its process is not
        registry.stop(scratch / "vetted")
        registry.stop(args.work / "src")
        shutil.rmtree(scratch, ignore_errors=True)
