"""The pull bench's private containerd (bench/cri.py): started with its CRI plugin on, a small
image pulled through CRI's `PullImage` from a local registry and run by `ctr` in `k8s.io`; after
it, and after an interrupt, no process, mount or folder of it is left."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from bench import containerds, cri
from builder.core import oci, rootfs_image

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
FILES = ["/bin/bash", "/lib/x86_64-linux-gnu/libtinfo.so.6", "/lib/x86_64-linux-gnu/libc.so.6",
         "/lib64/ld-linux-x86-64.so.2"]


def small_image(registry: str, tmp: Path, extra: dict[str, bytes] | None = None) -> str:
    """bash and its libraries (and `extra` files) as a one-layer image in `registry`; its
    reference."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in FILES:
            info = tar.gettarinfo(str(Path(path).resolve()), arcname=path.lstrip("/"))
            info.mtime = 0
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    layer = tmp / "rootfs.tar"
    layer.write_bytes(buf.getvalue())
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Cmd": ["/bin/bash"]},
                         "rootfs": {"type": "layers", "diff_ids": [
                             "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()]}}).encode()
    repo = f"cri-{uuid.uuid4().hex[:8]}"
    rootfs_image.push(oci.Registry(registry), repo, layer, config, ["t"])
    return f"{registry}/{repo}:t"


def left_behind(home: Path, state: Path, pid: int) -> list[str]:
    out = [str(p) for p in (home, state) if p.exists()]
    out += [m for p in (home, state) for m in cri.mounts_under(p)]
    out += [f"pid {p}" for p in [pid, *cri.shims(str(state / "containerd.sock"))]
            if Path(f"/proc/{p}").exists() and "zombie" not in
            Path(f"/proc/{p}/status").read_text().lower()]
    return out


def test_a_cri_pull_then_a_run_leaves_nothing_behind(registry_addr, tmp_path):
    shim_default = Path("/run/containerd/runc") / cri.NAMESPACE  # where runc's state went
    had_default = shim_default.exists()
    ref = small_image(registry_addr, tmp_path)
    with cri.PrivateContainerd([registry_addr]) as node:
        pulled = node.pull(ref)
        assert pulled["image"].startswith("sha256:") and pulled["s"] > 0
        assert pulled["cpu_s"] >= 0
        out = node.run(ref, "/bin/bash", "-c", "echo ran")
        assert out.strip() == "ran"
        assert (node.state / "runc" / cri.NAMESPACE).is_dir()  # runc's state is the node's
        home, state, pid = node.home, node.state, node.child.pid
    assert left_behind(home, state, pid) == []
    assert had_default or not shim_default.exists()


def test_a_container_still_running_when_the_node_closes_is_killed(registry_addr, tmp_path):
    """An interrupted `run` leaves its container running: close() kills and deletes it
    before its state folder goes."""
    ref = small_image(registry_addr, tmp_path)
    with cri.PrivateContainerd([registry_addr]) as node:
        node.pull(ref)
        node.ctr("run", "-d", "--runc-root", str(node.state / "runc"), ref, "busy",
                 "/bin/bash", "-c", "while :; do :; done")
        task = next(line.split() for line in node.ctr("tasks", "ls").splitlines()[1:])
        assert task[0] == "busy" and task[2] == "RUNNING", task
        home, state, pid = node.home, node.state, node.child.pid
    assert left_behind(home, state, pid) == []
    assert not Path(f"/proc/{task[1]}").exists() or "zombie" in \
        Path(f"/proc/{task[1]}/status").read_text().lower()


@pytest.mark.parametrize(("spec", "release"), [("debian-13", "1.7."), ("debian-sid", "2.")])
def test_debians_containerd_pulls_and_runs_and_leaves_nothing_behind(
        registry_addr, tmp_path, spec, release):
    """`--containerd debian-13|debian-sid`: the package through Debian's signature chain (the
    real deb.debian.org; sid's index accepted past its Valid-Until, as a frozen mirror needs),
    its own daemon, ctr and shim with the system's runc. containerd 2.x pulls through its
    transfer service: the hosts.toml config does not make it fall back, as `mirrors` would."""
    node = containerds.resolve(spec, tmp_path / "containerd", allow_expired=True)
    assert node.version.startswith(release) and node.go.startswith("go1.2"), node
    assert node.facts()["unpigz"] == "/usr/bin/unpigz"
    ref = small_image(registry_addr, tmp_path)
    with cri.PrivateContainerd([registry_addr], node=node) as private:
        pulled = private.pull(ref)
        assert pulled["image"].startswith("sha256:") and pulled["cpu_own_s"] >= 0
        out = private.run(ref, "/bin/bash", "-c", "echo ran")
        assert out.strip() == "ran"
        log = (private.home / "containerd.log").read_text()
        assert "local image pull mode" not in log and "`mirrors` is deprecated" not in log
        home, state, pid = private.home, private.state, private.child.pid
    assert left_behind(home, state, pid) == []


def test_the_working_set_is_what_the_start_read_of_the_evicted_image(registry_addr, tmp_path):
    """cold_start's whole path on a small image: pull, evict, run, residency. The start reads
    bash, its libraries and one data file (bash's `$(< file)`: the image has no `cat`); the
    8 MB it never opens is not in the working set."""
    read, unread = os.urandom(3 << 20), os.urandom(8 << 20)
    ref = small_image(registry_addr, tmp_path, {"/data/read": read, "/data/unread": unread})
    run = cri.cold_start(registry_addr, ref,  # the page cache kept: other tests share it
                         ("/bin/bash", "-c", ': "$(< /data/read)" 2>/dev/null; echo 0.25'),
                         empty_cache=False)
    ws = run["working_set"]
    touched = dict(map(tuple, ws["top"]))
    assert run["in_container_s"] == 0.25 and run["page_cache"] == "kept"
    assert touched["/data/read"] == len(read) and "/data/unread" not in touched
    assert "/bin/bash" in touched and ws["files"] >= 2
    assert ws["image_files"] == len(FILES) + 2 and ws["left_after_eviction"] == 0
    assert len(read) <= ws["bytes"] < ws["image_bytes"] - len(unread) // 2
    assert 0 < ws["share"] < 1


INTERRUPTED = """
import sys, time
from bench import containerds, cri
with cri.PrivateContainerd([sys.argv[1]]) as node:
    print(node.home, node.state, node.child.pid, flush=True)
    time.sleep(600)
"""


def test_an_interrupted_bench_leaves_nothing_behind(registry_addr):
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED, registry_addr], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    home, state, pid = child.stdout.readline().split()
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    assert left_behind(Path(home), Path(state), int(pid)) == []
