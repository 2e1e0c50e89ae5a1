"""`python -m bench arm64`: the linux/arm64 path end to end (emulated on an x86 host).

Builds the 2.15.0 py3.11 CUDA slim variant for linux/amd64 and linux/arm64 (smoke + SBOM each),
publishes both as one multi-arch image index to a bench registry, then checks what a Grace
node would get: `docker run --platform linux/arm64 TAG` imports torch, reports aarch64, CUDA and
the lock's cuDNN; the SBOM lists arm64 debs and aarch64 CUDA libraries; the smoke report says
`emulated: true`. Writes bench/arm64.json and bench/ARM64.md.

The bench registry keeps its storage in <state>/bench-arm64/ (so the emulated base bootstrap,
minutes under qemu, is reused the same day); it listens on a free port unless --addr names a
running one. Images built here are removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.figures import Figure, Results, _mb, _ratio, figure_table
from bench.harness import builder_cli, log
from bench.layers import free_port
from builder.core import engine, oci, registry, state
from builder.model import lockfile, matrix, platforms, smokereport
from builder.stages import smoketest

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
VARIANT = "2.15.0-py3.11-cuda-slim"
ARM = "linux/arm64"
PROBE = ("import json, platform, torch; print(json.dumps({'machine': platform.machine(), "
         "'torch': torch.__version__, 'cuda': torch.version.cuda, "
         "'cudnn': torch.backends.cudnn.version()}))")


def ensure_emulation() -> None:
    handler = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if platforms.emulated(ARM) and not handler.exists():
        log("no qemu-aarch64 binfmt handler: running tools/setup_emulation.sh")
        subprocess.run(["bash", str(ROOT / "tools" / "setup_emulation.sh")], check=True)


def bench_matrix(folder: Path, addr: str) -> Path:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["registry"] = addr
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def build_platform(res: Results, mpath: Path, platform: str) -> dict[str, Any]:
    """`builder build` of the variant on one platform, smoke and SBOM included."""
    seconds, data, _ = builder_cli("build", "--matrix", str(mpath), "--select", f"id={VARIANT}",
                                   "--select", f"platform={platform}", timeout=6 * 3600)
    [outcome] = data
    if outcome["state"] == "up-to-date":  # built by an earlier run: no fresh figure
        plan = builder_cli("plan", "--offline", "--matrix", str(mpath), "--select",
                           f"id={VARIANT}", "--select", f"platform={platform}")[1]
        ref = plan["include"][0]["image"]
        outcome |= {"image": ref, "image_id": (engine.inspect_image(ref) or {}).get("Id", "")}
        res.add(Figure(f"build {platform}", "up-to-date", note="built by an earlier run"))
    else:
        note = "emulated (qemu)" if platforms.emulated(platform) else "native"
        res.add(Figure(f"build {platform}", round(outcome["seconds"], 1), "s",
                       note=f"{note}; with base, smoke and SBOM: {seconds:.0f} s"))
    return outcome


def smoke_table(res: Results, image_id: str) -> dict[str, Any]:
    report = smoketest.load_report(image_id) or {}
    passed, reason = smokereport.report_passed(report, require_gpu=False)
    runner = report.get("runner") or {}
    res.details["smoke_table"] = smoketest.format_table(report, passed, reason) if report else ""
    res.add(Figure("smoke linux/arm64", "pass" if passed else "fail",
                   note=f"platform {runner.get('platform')}, emulated {runner.get('emulated')}; "
                   f"machine {(report.get('host') or {}).get('machine')}"))
    return report


def _components(image_id: str) -> list[dict[str, Any]]:
    doc = json.loads(state.evidence_path("sbom", image_id).read_text())
    stack, out = list(doc.get("components", [])), []
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(c.get("components", []))
    return out


def sbom_figures(res: Results, arm_id: str, amd_id: str) -> None:
    """arm64 debs, and NVIDIA libraries whose file hashes are not the amd64 image's: the
    aarch64 builds of the same CUDA release."""
    arm, amd = _components(arm_id), _components(amd_id)
    debs = [c.get("purl", "") for c in arm if c.get("purl", "").startswith("pkg:deb/")]
    arm_debs = [p for p in debs if "arch=arm64" in p]
    libs = [c for c in arm if c.get("type") == "library" and c.get("group") == "nvidia"]
    amd_hashes = {h["content"] for c in amd for h in c.get("hashes", [])}
    own = [c for c in libs if not {h["content"] for h in c.get("hashes", [])} & amd_hashes]
    wheels = sorted({c["purl"].split("@")[0].removeprefix("pkg:pypi/") for c in arm
                     if c.get("purl", "").startswith("pkg:pypi/nvidia-")})
    res.add(Figure("sbom arm64 debs", len(arm_debs), "", note=f"of {len(debs)} debs (the rest "
                   "arch=all)"))
    res.add(Figure("sbom NVIDIA libraries (aarch64 files)", len(own), "",
                   note=f"{len(libs)} NVIDIA .so components, {len(own)} with hashes unlike the "
                   f"amd64 image's; from {len(wheels)} wheels: {', '.join(wheels[:5])} …"))
    res.details["sbom"] = {"debs": len(debs), "arm64_debs": len(arm_debs),
                           "nvidia_wheels": wheels, "nvidia_libraries": len(libs),
                           "nvidia_libraries_not_in_amd64": len(own)}


def check_index(res: Results, addr: str, repo: str, tag: str) -> None:
    found = oci.Registry(addr).manifest(repo, tag)
    assert found is not None, f"no {tag} in {addr}/{repo}"
    doc = json.loads(found[0])
    arches = [f"{m['platform']['os']}/{m['platform']['architecture']}"
              for m in doc.get("manifests", [])]
    res.details["index"] = {"tag": tag, "digest": found[1].digest, "media_type":
                            found[1].media_type, "platforms": arches}
    res.add(Figure("index under one tag", ", ".join(arches) or found[1].media_type,
                   note=f"{addr}/{repo}:{tag} → {found[1].digest[:19]}"))


def run_arm64(res: Results, ref: str, lock_facts: dict[str, Any]) -> None:
    engine.docker("pull", "--platform", ARM, ref, timeout=1800)
    start = time.monotonic()
    out = engine.docker("run", "--rm", "--platform", ARM, "--network", "none", ref, "python",
                        "-c", PROBE, timeout=1800).stdout
    seconds = time.monotonic() - start
    got = json.loads(out.strip().splitlines()[-1])
    v = got["cudnn"] or 0
    cudnn = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 90000 else str(v)
    res.details["run_arm64"] = got | {"cudnn_dotted": cudnn, "lock": lock_facts}
    ok = (got["machine"] == "aarch64" and got["cuda"] == lock_facts["cuda"]
          and cudnn == lock_facts["cudnn"])
    res.add(Figure("docker run --platform linux/arm64", "ok" if ok else "MISMATCH",
                   note=f"machine {got['machine']}, torch {got['torch']}, cuda {got['cuda']} "
                   f"(lock {lock_facts['cuda']}), cudnn {cudnn} (lock {lock_facts['cudnn']}); "
                   f"import took {seconds:.0f} s emulated"))
    if not ok:
        raise RuntimeError(f"the arm64 image reports {got}, the lock says {lock_facts}")


def write_outputs(res: Results) -> None:
    data = {"mode": res.mode, "machine": res.machine, "errors": res.errors,
            "figures": [f.__dict__ for f in res.figures], "details": res.details}
    (HERE / "arm64.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["# linux/arm64 (emulated) results", "",
             "`python -m bench arm64` — generated by bench/arm64.py; do not edit.", "",
             *figure_table(res.figures, ratio_digits=2)]
    if res.details.get("smoke_table"):
        lines += ["", "## Smoke report of the arm64 image (under qemu)", "", "```",
                  res.details["smoke_table"], "```"]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"- {e.splitlines()[0]}" for e in res.errors]
    (HERE / "ARM64.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench arm64",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", help="use this running registry (default: start the bench's)")
    parser.add_argument("--keep", action="store_true", help="keep the images built and pulled")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    ensure_emulation()
    engine.ensure_disk(ROOT, 25)  # two CUDA images (~5 GB each), arm64 wheels, the base
    res = Results("arm64")
    storage = state.path("bench-arm64")
    addr = args.addr or f"127.0.0.1:{free_port()}"
    if not args.addr:
        registry.start(addr, storage)
    made: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-arm64-") as tmp:
            mpath = bench_matrix(Path(tmp), addr)
            m = matrix.load(mpath)
            amd, arm = m.select([f"id={VARIANT}"])
            built = {p: build_platform(res, mpath, p) for p in (amd.platform, ARM)}
            made += [o["image"] for o in built.values()]
            sizes = {p: int((engine.inspect_image(o["image"]) or {}).get("Size", 0))
                     for p, o in built.items()}
            res.add(Figure("size linux/arm64", _mb(sizes[ARM]), "MB", _mb(sizes[amd.platform]),
                           _ratio(sizes[ARM], sizes[amd.platform]), "arm64 / amd64"))
            smoke_table(res, built[ARM]["image_id"])
            sbom_figures(res, built[ARM]["image_id"], built[amd.platform]["image_id"])
            builder_cli("publish", "--matrix", str(mpath), "--select", f"id={VARIANT}",
                        "--allow-cpu-smoke", "--unsigned",
                        "--manifest", str(Path(tmp) / "published.json"))
            tag = built[ARM]["image"].rsplit(":", 1)[1].removesuffix(
                platforms.get(ARM).suffix)
            check_index(res, addr, m.repository, tag)
            made.append(f"{m.image_name}:{tag}")
            run_arm64(res, f"{m.image_name}:{tag}",
                      lockfile.require_lock(ROOT / "locks", arm).facts)
    except Exception as exc:  # the figures so far are still written
        res.errors.append(str(exc))
        log(f"FAILED: {exc}")
    finally:
        write_outputs(res)
        if not args.keep:
            for ref in made:
                engine.remove_image(ref)
        if not args.addr:
            registry.stop(storage)
    log(f"wrote {HERE / 'arm64.json'} and {HERE / 'ARM64.md'}")
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
