"""bench/PULL.md and the `pull` entry of bench/results.json, from `python -m bench pull`."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

from bench.figures import Figure, _ratio, figure_table
from builder.core import zstd

GOALS = {"ratio": 0.7, "rss_mb": 250.0, "added_s": 60.0, "cri_wall": 0.7, "cri_cpu": 0.55}
CUDA_SLIM = "2.15.0-py3.11-cuda-slim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _at(t: dict[str, Any]) -> str:
    """Where a timing was taken: the load average before it, and every run's seconds."""
    runs = ", ".join(f"{r['s']:.1f}" for r in t.get("runs", [])) or f"{t['s']:.1f}"
    return f"load {t['load']:.1f}; runs {runs} s"


def cri_figures(v: dict[str, Any], name: str) -> list[Figure]:
    """As a kubelet pulls, on containerd `name`: time to the first matmul and containerd's
    CPU-seconds (its own, and its children's: `unpigz`), zstd / gzip."""
    run = v.get("cri", {}).get(name)
    if not run:
        return []
    variant, gz, zs = v["id"], run["gzip"], run["zstd"]
    goal = variant == CUDA_SLIM
    return [
        Figure(f"CRI pull + first matmul, zstd / gzip ({variant}, {name})", zs["to_matmul_s"],
               "s", gz["to_matmul_s"], _ratio(zs["to_matmul_s"], gz["to_matmul_s"]),
               f"zstd: pull {zs['s']:.1f} + start {zs['start_s']:.1f} s, load {zs['load']:.1f}; "
               f"gzip: pull {gz['s']:.1f} + start {gz['start_s']:.1f} s, load {gz['load']:.1f}; "
               f"page cache before the pull: {zs.get('page_cache', 'kept')}"
               + (f"; goal ≤ {GOALS['cri_wall']}" if goal else "")),
        Figure(f"CRI pull: containerd CPU-seconds, zstd / gzip ({variant}, {name})",
               zs["cpu_s"], "s", gz["cpu_s"], _ratio(zs["cpu_s"], gz["cpu_s"]),
               f"{cpu_parts(zs, gz, run['containerd'])}; bytes fetched "
               f"{zs['bytes'] / 1e6:.1f} / {gz['bytes'] / 1e6:.1f} MB"
               + (f"; goal ≤ {GOALS['cri_cpu']}" if goal else "")),
    ]


def cpu_parts(zs: dict[str, Any], gz: dict[str, Any], facts: dict[str, Any]) -> str:
    """The CPU figure's two halves: containerd's own (utime+stime) and its waited-for
    children's (cutime+cstime: `unpigz` decompresses gzip there when it is on the PATH)."""
    if "cpu_own_s" not in zs:
        return "/proc/<pid>/stat utime+stime (+ waited children)"
    unpigz = {"": "not on its PATH", "disabled": "disabled (CONTAINERD_DISABLE_PIGZ=1)"}.get(
        facts.get("unpigz", ""), "on its PATH")
    split = (f" (user {zs['cpu_user_s']:.1f} / {gz['cpu_user_s']:.1f}, system "
             f"{zs['cpu_sys_s']:.1f} / {gz['cpu_sys_s']:.1f})" if "cpu_user_s" in zs else "")
    return (f"containerd's own (utime+stime) {zs['cpu_own_s']:.1f} / {gz['cpu_own_s']:.1f} s "
            f"({own_cpu_ratio(zs, gz):.2f}){split}, its children (cutime+cstime) "
            f"{zs['cpu_children_s']:.1f} / {gz['cpu_children_s']:.1f} s; unpigz {unpigz}")


def working_set_figures(name: str, ws: dict[str, Any] | None) -> list[Figure]:
    """The startup working set (bench/workingset.py): the bytes a cold `import torch` + first
    matmul read, against the image's unpacked bytes: what a lazy-pulling format must fetch
    before the first step."""
    if not ws:
        return []
    top = ", ".join(f"{path} {n / 1e6:.0f} MB" for path, n in ws["top"][:3])
    return [Figure(f"startup working set: bytes a cold start read ({name})",
                   round(ws["bytes"] / 1e6, 1), "MB", round(ws["image_bytes"] / 1e6, 1),
                   ws["share"], f"files {ws['files']} of {ws['image_files']} "
                   f"({ws['files_share']:.0%}); page-cache residency (fincore) after "
                   f"evicting the image's files; most: {top}")]


def figures(v: dict[str, Any]) -> list[Figure]:
    """The figures of one variant besides the CRI pull: the startup working set, the `ctr`
    pull's seconds and ratio, each against the floor, and what the twin costs promotion."""
    name, pull, floor = v["id"], v["pull"], v["parts"]["floor_tar_x"]
    gz, zs, fl = pull["gzip"]["s"], pull["zstd"]["s"], floor["s"]
    twin = v["twin"]
    return [*working_set_figures(name, v.get("working_set")),
        Figure(f"`ctr` pull+unpack, zstd twin / gzip tag ({name})", zs, "s", gz, _ratio(zs, gz),
               f"zstd {_at(pull['zstd'])}; gzip {_at(pull['gzip'])}"
               + (f"; goal ≤ {GOALS['ratio']}" if name == CUDA_SLIM else "")),
        Figure(f"pull+unpack gzip / floor ({name})", gz, "s", fl, _ratio(gz, fl),
               f"floor: tar -x of the {floor_gb(v)} GB of layers from local files, "
               f"{_at(floor)}; sync after it {floor['sync_s']:.1f} s (not counted)"),
        Figure(f"pull+unpack zstd / floor ({name})", zs, "s", fl, _ratio(zs, fl), ""),
        Figure(f"layer bytes, zstd / gzip ({name})", round(twin["zstd_bytes"] / 1e6, 1), "MB",
               round(twin["gzip_bytes"] / 1e6, 1), _ratio(twin["zstd_bytes"],
                                                          twin["gzip_bytes"]),
               f"uncompressed {twin['tar_bytes'] / 1e6:.1f} MB; {zstd.ENCODER}"),
        Figure(f"promotion with the twin: peak RSS ({name})", twin["hwm_mb"], "MB",
               GOALS["rss_mb"], _ratio(twin["hwm_mb"], GOALS["rss_mb"]),
               f"VmHWM of the process that promoted (peak {twin['hwm_promote_mb']} MB) and "
               f"then made the twin; baseline = the goal"),
        Figure(f"promotion: seconds the twin adds ({name})", twin["twin_s"], "s",
               twin["promote_s"], _ratio(twin["twin_s"], twin["promote_s"]),
               f"baseline: the cross-registry promotion alone (load {twin['promote_load']}); "
               f"twin at load {twin['twin_load']}, {twin['workers']} zstd workers, "
               f"{os.cpu_count()} cores"
               + (f", {twin['twin_cpu_s']} CPU-s in the twin process (all its threads)"
                  if "twin_cpu_s" in twin else "") + f"; goal ≤ {GOALS['added_s']:.0f} s"),
    ]


def floor_gb(v: dict[str, Any]) -> str:
    return f"{v['parts']['tar_bytes'] / 1e9:.2f}"


def breakdown(v: dict[str, Any]) -> list[str]:
    """Where the time goes: each part measured alone, against the floor."""
    p, split, fl = v["parts"], v["split"], v["parts"]["floor_tar_x"]["s"]
    rows = [
        ("whole pull + unpack (min)", v["pull"]["gzip"], v["pull"]["zstd"]),
        ("download: `ctr content fetch` (HTTP, digest check, content store)",
         split["gzip"]["fetch"], split["zstd"]["fetch"]),
        ("unpack: the pull once the content is there", split["gzip"]["unpack"],
         split["zstd"]["unpack"]),
        ("decompression alone (`unpigz -dc` / `zstd -dc` to /dev/null)", p["unpigz_dc"],
         p["zstd_dc"]),
        ("sha256 of the compressed blobs (`sha256sum`)", p["sha256_gzip"], p["sha256_zstd"]),
        ("sha256 of the uncompressed layers (diff ids)", p["sha256_tar"], p["sha256_tar"]),
        ("writing: `tar -x` from local files (the floor)", p["floor_tar_x"], p["floor_tar_x"]),
    ]
    lines = [f"### {v['id']}", "",
             "| part | gzip s | zstd s | gzip / floor | zstd / floor | load (gzip; zstd) |",
             "|---|---|---|---|---|---|"]
    for what, g, z in rows:
        lines.append(f"| {what} | {g['s']:.1f} | {z['s']:.1f} | {g['s'] / fl:.2f} | "
                     f"{z['s'] / fl:.2f} | {g['load']:.1f}; {z['load']:.1f} |")
    return lines


def write(results: list[dict[str, Any]], started: str, runs: int, here: Path) -> None:
    """bench/PULL.md from every variant results.json holds (this run's replacing the same
    variant's, per containerd), and the `pull` entry of results.json, other entries kept."""
    path = here / "results.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    held = data.get("pull") or {}
    merged = merge(held.get("results") or [], results, held.get("started"))
    cri = [f for v in merged for name in containerds_of(merged) for f in cri_figures(v, name)]
    rest = [f for v in merged for f in figures(v)]
    for f in [*cri, *rest]:
        print(f.line(), flush=True)
    (here / "PULL.md").write_text("\n".join(report(merged, runs, here)))
    data["pull"] = {"started": started, "runs": runs, "results": merged,
                    "figures": [f.__dict__ for f in [*cri, *rest]]}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def report(merged: list[dict[str, Any]], runs: int, here: Path) -> list[str]:
    """bench/PULL.md's lines: a CRI table per containerd, its goals, the rest, the history."""
    lines = ["# Bytes to a node: containerd pulls of the gzip tag and its zstd twin", "",
             "`python -m bench pull` — generated by bench/pull.py; do not edit.", "",
             f"On {os.cpu_count()} cores (shared with other work: the load average is beside "
             f"every timing); loopback registry (docker-registry 2.8); `ctr` pulls min of "
             f"{runs} per tag, gzip and zstd alternating. Measured: "
             + "; ".join(f"{v['id']} {v.get('started', '?')} (CRI: min of "
                         f"{v.get('cri_runs', 3)})" for v in merged) + ".", "",
             "## As a kubelet pulls: CRI `PullImage`, then the first matmul, per containerd", "",
             "Each run on a fresh node: a new private containerd (empty content store and "
             "snapshotter) and, where the note says `emptied`, an emptied page cache (`sync; "
             "echo 3 > /proc/sys/vm/drop_caches`), as on a freshly booted node; `kept`: as "
             "the earlier runs left it, which costs both formats more system time.", ""]
    for name in containerds_of(merged):
        lines += [*containerd_heading(merged, name), "",
                  *figure_table([f for v in merged for f in cri_figures(v, name)],
                                value=_value), ""]
    lines += ["## Goals", "", *goal_lines(merged), "",
              f"## Working set, the `ctr` path (dockerd's containerd, {containerd_version()}) "
              "and the twin's cost", "",
              *figure_table([f for v in merged for f in figures(v)], value=_value), "",
              "## Where the time goes (`ctr` path)", "",
              "Each part measured alone (the pull overlaps download and unpack, so the parts "
              "do not add up to the whole).", ""]
    for v in merged:
        lines += [*breakdown(v), ""]
    lines += ["## The twins", ""]
    for v in merged:
        lines.append(f"- {v['id']}: gzip {v['gzip_digest']} → zstd twin {v['twin']['twin']} "
                     f"({v['twin']['layers']} layers)"
                     + (f"; containerd ran it: `python -c \"import torch; "
                        f"print(torch.__version__)\"` → `{v['twin_runs']}`"
                        if v.get("twin_runs") else ""))
    history = here / "PULL-earlier.md"
    return [*lines, "", history.read_text()] if history.exists() else lines


def containerd_heading(merged: list[dict[str, Any]], name: str) -> list[str]:
    """Which containerd a table is: as the newest run recorded it."""
    newest = sorted((v for v in merged if name in v.get("cri", {})),
                    key=lambda v: v.get("started") or "", reverse=True)
    facts = newest[0]["cri"][name]["containerd"]
    unpigz = {None: "not recorded", "": "not on its PATH",
              "disabled": "disabled (CONTAINERD_DISABLE_PIGZ=1: gzip is inflated in "
                          "containerd's own process, as on a node without pigz)"}.get(
        facts.get("unpigz"), facts.get("unpigz"))
    return [f"### containerd {facts['version']}, built with {facts['go']} (`--containerd "
            f"{name}`)", "", f"From {facts['source']}; unpigz: {unpigz}."]


def _value(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def goal_lines(results: list[dict[str, Any]]) -> list[str]:
    """The goals, judged on the CUDA slim: the CRI ratios per containerd, then the `ctr`
    path's and the twin's."""
    out = []
    for v in (v for v in results if v["id"] == CUDA_SLIM):
        for name, run in v.get("cri", {}).items():
            facts, gz, zs = run["containerd"], run["gzip"], run["zstd"]
            # the table's own ratios, so the two never round differently
            wall = goal_ratio(zs["to_matmul_s"], gz["to_matmul_s"])
            cpu = goal_ratio(zs["cpu_s"], gz["cpu_s"])
            own = (f" (containerd's own CPU alone: {own_cpu_ratio(zs, gz):.2f})"
                   if gz.get("cpu_own_s") else "")
            out.append(f"- containerd {facts['version']} ({facts['go']}, `{name}`): time to "
                       f"the first matmul {wall:.2f} (goal ≤ {GOALS['cri_wall']}): "
                       f"{judged(wall, GOALS['cri_wall'])}; containerd CPU-seconds {cpu:.2f} "
                       f"(goal ≤ {GOALS['cri_cpu']}): {judged(cpu, GOALS['cri_cpu'])}{own}")
        twin = v["twin"]
        for what, have, goal in (("`ctr` path: zstd/gzip pull ratio",
                                  v["pull"]["zstd"]["s"] / v["pull"]["gzip"]["s"],
                                  GOALS["ratio"]),
                                 ("peak RSS of promotion with the twin, MB", twin["hwm_mb"],
                                  GOALS["rss_mb"]),
                                 ("seconds the twin adds to promotion", twin["twin_s"],
                                  GOALS["added_s"])):
            out.append(f"- {what}: {have:.2f} (goal ≤ {goal}): {judged(have, goal)}")
    return out or ["- the CUDA slim image was not measured in this run"]


def goal_ratio(a: float, b: float) -> float:
    """The table's ratio; a zero baseline is infinite, so it can never meet a goal."""
    ratio = _ratio(a, b)
    return math.inf if ratio is None else ratio


def own_cpu_ratio(zs: dict[str, Any], gz: dict[str, Any]) -> float:
    """containerd's own CPU-seconds, zstd / gzip, its children's (`unpigz`) left out."""
    return goal_ratio(zs["cpu_own_s"], gz["cpu_own_s"])


def judged(have: float, goal: float) -> str:
    return "met" if have <= goal else "NOT met"


# ---- results.json: one variant's run never drops another's ---------------------------------

# What a record written before the bench measured several containerds ran on.
LEGACY = {"name": "system", "version": "1.6.20~ds1", "go": "go1.19.8", "unpigz": None,
          "source": "/usr/bin/containerd (Debian 12; recorded before the bench named it)"}


def normalized(v: dict[str, Any], started: str | None) -> dict[str, Any]:
    """A record in today's shape: `cri` keyed by containerd, `started` on the record."""
    cri = v.get("cri") or {}
    if "gzip" in cri:  # one containerd, before --containerd
        cri = {"system": {**cri, "containerd": LEGACY}}
    return {**v, "cri": cri, "started": v.get("started") or started}


def merge(held: list[dict[str, Any]], new: list[dict[str, Any]], held_started: str | None
          ) -> list[dict[str, Any]]:
    """`held` with `new` laid over it: a variant measured now replaces its record, keeping
    the CRI runs of containerds this run did not measure; other variants are kept as they
    were (in their order, new variants after)."""
    out = {v["id"]: normalized(v, held_started) for v in held}
    for v in new:
        old = out.get(v["id"], {}).get("cri", {})
        out[v["id"]] = {**normalized(v, None), "cri": {**old, **(v.get("cri") or {})}}
    return list(out.values())


def containerds_of(results: list[dict[str, Any]]) -> list[str]:
    """Every containerd measured, the system's first."""
    names = dict.fromkeys(n for v in results for n in v.get("cri", {}))
    return sorted(names, key=lambda n: n != "system")


def containerd_version() -> str:
    from builder.core import proc

    out = proc.run(["ctr", "--version"], check=False).stdout.strip()
    return out.rsplit(" ", 1)[-1] or "unknown"
