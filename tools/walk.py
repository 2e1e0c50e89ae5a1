"""Measure the "walk" of `builder build --stage` for one variant (issue 31).

Runs `builder build --select id=VARIANT --stage --force --json` in-process against fakes of the
engine, the registry client, git/proc and the SBOM generator (core-level stand-ins, the same for
every layout of builder/), with sys.setprofile recording every call into a builder module.

For an entry function E (matched by `module:qualname`), the walk is the sequence of modules of
the builder functions E calls directly (comprehensions and lambdas inside E count as E), in
call order; consecutive calls into one module are one "stay"; a "return" is a stay in a module
the walk had already left. `--deep` also reports the walk of every call below E, with builder.core
and builder.model left out (the layers every step uses) and E's own module left out (the hub).

usage: .venv/bin/python tools/walk.py REPO [--deep] ENTRY... (REPO: a checkout, put first on
sys.path; e.g. `tools/walk.py . --deep builder.flows.build:build_images`)
`--steps MODULE` (e.g. builder.flows.publish, builder.flows.build) prints the flow's declared
STEPS instead, without running anything.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def smoke_report(image_id: str) -> dict[str, Any]:
    from smoke.checks import CHECKS, GPU_CHECKS

    checks = {n: ("substituted" if n in GPU_CHECKS else "pass") for n in CHECKS}
    checks["cuda"] = "skip"
    return {"schema_version": 1, "image": {"ref": None, "id": image_id, "digest": None},
            "facts": {"accelerator": "cpu", "torch": "2.13.0", "python": "3.11"},
            "host": {"gpus": [], "driver": None}, "require_gpu": False,
            "started": "2026-01-02T00:00:00+00:00", "finished": "2026-01-02T00:01:00+00:00",
            "status": "pass", "checks": [{"name": n, "status": s, "duration_s": 0.1,
                                          "message": n, "metrics": {}} for n, s in checks.items()]}


IMAGE_ID = "sha256:" + "1" * 64


def install_fakes() -> None:
    """Stand-ins at the core boundary (and for subprocesses, git, the SBOM library)."""
    from builder.core import engine, oci, proc, registry_auth

    pushed: dict[str, Any] = {}

    def docker(*args: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        argv = [str(a) for a in args]
        if argv[0] == "build":
            Path(argv[argv.index("--iidfile") + 1]).write_text(IMAGE_ID)
        if argv[0] == "push":
            pushed[argv[1]] = IMAGE_ID
        return subprocess.CompletedProcess(argv, 0, "", "")

    def inspect_image(ref: str) -> dict[str, Any]:
        return {"Id": IMAGE_ID, "Size": 1000, "RepoDigests": [],
                "RootFS": {"Layers": ["sha256:" + "2" * 64]}, "Architecture": "amd64",
                "Os": "linux", "Config": {"Labels": {"io.torch-images.accelerator": "cpu"}}}

    def run_container(name: str, args: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, json.dumps(smoke_report(IMAGE_ID)), "")

    class Registry:
        def __init__(self, registry: str, *a: Any, **kw: Any) -> None:
            self.registry = registry

        def head(self, repository: str, ref: str) -> Any:
            return None

        def manifest(self, repository: str, ref: str) -> Any:
            body = json.dumps({"config": {"digest": IMAGE_ID}}).encode()
            return body, oci.Descriptor(media_type=oci.OCI_MANIFEST, digest="sha256:" + "3" * 64,
                                        size=len(body))

        def push_artifact(self, repository: str, subject: Any, artifact_type: str,
                          data: bytes, **kw: Any) -> Any:
            return oci.Descriptor(media_type=oci.OCI_MANIFEST,
                                  digest="sha256:" + hashlib.sha256(data).hexdigest(),
                                  size=len(data))

    @contextlib.contextmanager
    def docker_env(registry: str) -> Any:
        yield {}

    def run(argv: Any, *a: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "")

    engine.ensure_engine = lambda: {"ServerVersion": "24.0.0"}  # type: ignore[assignment]
    engine.ensure_disk = lambda *a, **kw: None  # type: ignore[assignment]
    engine.docker = docker  # type: ignore[assignment]
    engine.inspect_image = inspect_image  # type: ignore[assignment]
    engine.run_container = run_container  # type: ignore[assignment]
    oci.Registry = Registry  # type: ignore[misc,assignment]
    registry_auth.docker_env = docker_env  # type: ignore[assignment]
    proc.run = run  # type: ignore[assignment]
    subprocess.run = run  # type: ignore[assignment]  # the old build.git()
    from builder.core import reproducible

    reproducible.normalise_image = lambda image_id, *a, **kw: image_id  # type: ignore[assignment]
    import sbom

    sbom.generate = lambda *a, **kw: {"bomFormat": "CycloneDX", "specVersion": "1.6",  # type: ignore[assignment]
                                      "version": 1, "components": []}
    sbom.write = lambda doc, target: Path(target).write_text(json.dumps(doc))  # type: ignore[assignment]


def seed_wheelhouse() -> None:
    """The pinned uv's wheel, already in the wheelhouse (no download)."""
    import re

    from builder.core import state

    try:
        from builder.stages.render import uv_requirements
    except ImportError:
        from builder.stages.wheelhouse import uv_requirements  # type: ignore[no-redef]
    root = state.path("wheelhouse")
    index = {}
    for n, h in enumerate(re.findall(r"sha256:([0-9a-f]{64})", uv_requirements())):
        name = f"uv-0.0.{n}-py3-none-manylinux_2_17_x86_64.whl"
        (root / name).write_bytes(b"w")
        index[h] = name
    (root / "index.json").write_text(json.dumps(index))


class Walk:
    def __init__(self, entries: list[str]) -> None:
        self.entries = entries
        self.direct: dict[str, list[str]] = {e: [] for e in entries}
        self.deep: dict[str, list[str]] = {e: [] for e in entries}
        self.two: dict[str, list[str]] = {e: [] for e in entries}
        self.active: dict[str, int] = {e: 0 for e in entries}

    @staticmethod
    def name(frame: Any) -> str:
        return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}"

    def logical(self, frame: Any) -> Any:
        """The frame, or for a comprehension/lambda the function it is written in."""
        while frame is not None and frame.f_code.co_name.startswith("<") and frame.f_back \
                and frame.f_back.f_globals is frame.f_globals:
            frame = frame.f_back
        return frame

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        name = self.name(frame)
        if name in self.active:
            self.active[name] += 1 if event == "call" else -1
            if event == "return":
                return
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("builder.") or frame.f_code.co_name.startswith("<"):
            return
        caller = self.logical(frame.f_back)
        caller_name = self.name(caller) if caller is not None else ""
        grand = self.logical(caller.f_back) if caller is not None else None
        grand_name = self.name(grand) if grand is not None else ""
        for e in self.entries:
            if caller_name == e and name != e:
                self.direct[e].append(module)
            if name != e and (caller_name == e or grand_name == e):
                self.two[e].append(module)
            if self.active[e] > 0 and name != e:
                self.deep[e].append(module)


def stays(modules: list[str]) -> list[str]:
    out: list[str] = []
    for m in modules:
        if not out or out[-1] != m:
            out.append(m)
    return out


def returns(seq: list[str]) -> int:
    seen: set[str] = set()
    count = 0
    for i, m in enumerate(seq):
        if m in seen:
            count += 1
        if i + 1 < len(seq):
            seen.add(m)
        seen.add(m)
    return count


def by_module(seq: list[str]) -> str:
    seen: set[str] = set()
    count: dict[str, int] = {}
    for m in seq:
        if m in seen:
            count[short(m)] = count.get(short(m), 0) + 1
        seen.add(m)
    return ", ".join(f"{m} {n}" for m, n in sorted(count.items(), key=lambda x: -x[1]))


def short(m: str) -> str:
    return m.removeprefix("builder.")


def declared_steps(module: str) -> str:
    """A flow's declared steps, in order: `module: a → b → c`."""
    import importlib

    steps = importlib.import_module(module).STEPS
    return f"{module}: {' → '.join(s.__name__ for s in steps)}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", type=Path)
    ap.add_argument("entries", nargs="*", help="module:qualname of each entry function")
    ap.add_argument("--steps", action="append", default=[], metavar="MODULE",
                    help="print the declared STEPS of a flow module instead")
    ap.add_argument("--variant", default="2.13.0-py3.11-cpu-runtime")
    ap.add_argument("--deep", action="store_true")
    args = ap.parse_args()
    repo = args.repo.resolve()
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    if args.steps:
        for module in args.steps:
            print(declared_steps(module))
        return 0
    tmp = tempfile.mkdtemp(prefix="walk-")
    os.environ["BUILDER_STATE"] = tmp
    install_fakes()
    seed_wheelhouse()
    from builder import cli
    from builder.core import proc

    proc.install_signal_handlers = lambda: None  # type: ignore[assignment]
    walk = Walk(args.entries)
    out, err = io.StringIO(), io.StringIO()
    sys.setprofile(walk)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["build", "--select", f"id={args.variant}", "--stage", "--force",
                           "--json"])
    finally:
        sys.setprofile(None)
        shutil.rmtree(tmp, ignore_errors=True)
    result = json.loads(out.getvalue())
    print(f"rc={rc} state={result[0]['state']} staged={result[0]['message']}")
    for e in args.entries:
        seq = stays(walk.direct[e])
        print(f"{e}: direct walk {returns(seq)} returns in {len(seq)} stays: "
              + " → ".join(short(m) for m in seq))
        two = stays(walk.two[e])
        print(f"{e}: walk to depth 2 (its callees and theirs) {returns(two)} returns in "
              f"{len(two)} stays; by module: {by_module(two)}")
        if args.deep:
            for label, keep in (("every builder module", lambda m: True),
                                ("steps and flows (no core/model)",
                                 lambda m: not m.startswith(("builder.core", "builder.model")))):
                deep = stays([m for m in walk.deep[e] if keep(m)])
                print(f"{e}: deep walk, {label}: {returns(deep)} returns in {len(deep)} stays; "
                      f"by module: {by_module(deep)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
