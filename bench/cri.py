"""A private containerd, pulled from as a kubelet pulls: over CRI's `ImageService.PullImage`.

dockerd's containerd has its CRI plugin disabled, so the bench starts its own: a containerd
binary (bench/containerds.py: the system's, Debian 13's, Debian unstable's or a folder given;
the system's by default) with its own root, state and socket and the CRI plugin on, started and
stopped by `PrivateContainerd` (a context manager that leaves no process, mount or folder
behind, also when interrupted: its exit runs on `Interrupted`).

The CRI messages are encoded by hand: the few fields used here, from the CRI v1 API,
https://github.com/kubernetes/cri-api/blob/master/pkg/apis/runtime/v1/api.proto
  ImageSpec        { string image = 1; }
  PullImageRequest { ImageSpec image = 1; AuthConfig auth = 2;
                     PodSandboxConfig sandbox_config = 3; }
  PullImageResponse{ string image_ref = 1; }
  VersionRequest   { string version = 1; }
  VersionResponse  { string version = 1; string runtime_name = 2; string runtime_version = 3;
                     string runtime_api_version = 4; }
No generated code and no protobuf dependency: grpcio sends the bytes as they are.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench import containerds, workingset
from bench.varint import read_varint, varint
from builder.core import proc
from builder.core.errors import BuilderError

PULL = "/runtime.v1.ImageService/PullImage"
VERSION = "/runtime.v1.RuntimeService/Version"
NAMESPACE = "k8s.io"  # where CRI keeps its images (and where `ctr run` finds them)
TICKS = os.sysconf("SC_CLK_TCK")


# ---- protobuf wire format: length-delimited string fields only ---------------------------------


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string or an embedded message."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def strings(message: bytes) -> dict[int, str]:
    """The length-delimited fields of a message, by number (others are skipped)."""
    out, i = {}, 0
    while i < len(message):
        key, i = read_varint(message, i)
        kind = key & 7
        if kind == 0:
            _, i = read_varint(message, i)
        elif kind == 2:
            size, i = read_varint(message, i)
            out[key >> 3] = message[i:i + size].decode(errors="replace")
            i += size
        else:
            i += {1: 8, 5: 4}[kind]
    return out


def pull_request(ref: str) -> bytes:
    return field(1, field(1, ref.encode()))


# ---- the private containerd -------------------------------------------------------------------


def config_text(root: Path, state: Path, sock: Path, hosts: Path) -> str:
    """containerd's config (version 2, which 2.x migrates on load): own root, state and
    socket; CRI on, no TCP stream server; registries as `hosts` (`config_path`) describes
    them. Not the deprecated `registry.mirrors`: on 2.x that turns CRI's transfer service
    off, and a node's default pull path is what is measured."""
    return (f'version = 2\nroot = "{root}"\nstate = "{state}"\n'
            f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
            '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root}/opt"\n'
            '[plugins."io.containerd.grpc.v1.cri"]\n  disable_tcp_service = true\n'
            '  stream_server_address = "127.0.0.1"\n  stream_server_port = "0"\n'
            '[plugins."io.containerd.grpc.v1.cri".registry]\n'
            f'  config_path = "{hosts}"\n')


def hosts_toml(registry: str) -> str:
    """A loopback registry's `hosts.toml` (containerd's hosts directory format): the registry
    itself, over plain HTTP."""
    return f'server = "http://{registry}"\n'


class PrivateContainerd:
    """`with PrivateContainerd([registry]) as c: c.pull(ref)`: a containerd of the bench's own."""

    def __init__(self, registries: list[str], base: Path = Path("/var/tmp"),
                 node: containerds.Containerd | None = None) -> None:
        self.node = node
        self.home = Path(tempfile.mkdtemp(prefix="bench-cri-", dir=base))
        self.state = Path(tempfile.mkdtemp(prefix="bench-cri-", dir="/run"))
        self.sock = self.state / "containerd.sock"
        self.registries = registries
        self.child: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def __enter__(self) -> PrivateContainerd:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def start(self, timeout: float = 30) -> None:
        node = self.node = self.node or containerds.system()
        hosts = self.home / "certs.d"
        for registry in self.registries:
            (hosts / registry).mkdir(parents=True)
            (hosts / registry / "hosts.toml").write_text(hosts_toml(registry))
        config = self.home / "config.toml"
        config.write_text(config_text(self.home / "root", self.state, self.sock, hosts))
        log = (self.home / "containerd.log").open("wb")
        self.child = subprocess.Popen([node.containerd, "--config", str(config)], stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      env=node.env())
        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call(VERSION, field(1, b"v1"), timeout=2)
                return
            except grpc.RpcError:
                if self.child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"containerd did not answer on {self.sock}: "
                                       f"see {self.home / 'containerd.log'}") from None
                time.sleep(0.2)

    def call(self, method: str, request: bytes, timeout: float = 3600) -> bytes:
        assert self.channel is not None
        rpc = self.channel.unary_unary(method, request_serializer=None,
                                       response_deserializer=None)
        return rpc(request, timeout=timeout)

    def cpu_seconds(self) -> dict[str, float]:
        """containerd's CPU seconds so far: its own user and system time (utime, stime) and
        its waited-for children's (cutime + cstime: `unpigz`, when it runs one) —
        /proc/<pid>/stat fields 14-17."""
        assert self.child is not None
        fields = Path(f"/proc/{self.child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system, c_user, c_system = (int(x) / TICKS for x in fields[11:15])
        return {"user": user, "sys": system, "children": c_user + c_system}

    def pull(self, ref: str) -> dict[str, Any]:
        """One CRI pull: wall seconds, containerd CPU-seconds over it (its own, split into
        user and system time, and its children's, and their sum), the image id."""
        before, start = self.cpu_seconds(), time.monotonic()
        image_id = strings(self.call(PULL, pull_request(ref))).get(1, "")
        seconds = round(time.monotonic() - start, 2)
        after = self.cpu_seconds()
        spent = {k: after[k] - before[k] for k in after}
        return {"s": seconds, "cpu_s": round(sum(spent.values()), 2),
                "cpu_own_s": round(spent["user"] + spent["sys"], 2),
                "cpu_user_s": round(spent["user"], 2), "cpu_sys_s": round(spent["sys"], 2),
                "cpu_children_s": round(spent["children"], 2), "image": image_id}

    def snapshots(self) -> Path:
        """Where the overlayfs snapshotter keeps the unpacked layers (`<n>/fs`)."""
        return self.home / "root" / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"

    def ctr(self, *args: str, timeout: float = 600) -> str:
        assert self.node is not None
        argv = [self.node.ctr, "--address", str(self.sock), "-n", NAMESPACE, *args]
        return proc.run(argv, timeout=timeout).stdout

    def run(self, ref: str, *argv: str, timeout: float = 1800) -> str:
        """`ctr run --rm` of `ref` in a new container; runc keeps its state under this
        containerd's state folder (a shim's default, /run/containerd/runc/<namespace>, would
        outlive it)."""
        return self.ctr("run", "--rm", "--runc-root", str(self.state / "runc"), ref,
                        f"bench-{os.getpid()}-{time.monotonic_ns()}", *argv, timeout=timeout)

    def close(self) -> None:
        """Stop any container still running (an interrupted `run`), containerd and its shims,
        unmount what is mounted under its folders, remove them. Safe to call twice."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        remove_containers(self.state / "runc" / NAMESPACE)
        for pid in shims(str(self.sock)):
            kill(pid)
        if self.child is not None:
            proc.stop_child(self.child, signal.SIGTERM, grace=15)
        for folder in (self.home, self.state):
            for target in mounts_under(folder):
                subprocess.run(["umount", "-l", target], check=False)
            shutil.rmtree(folder, ignore_errors=True)


def remove_containers(runc_root: Path) -> None:
    """Every container runc keeps state for under `runc_root`, killed and deleted (`runc
    delete --force`), so no process outlives the folder its state was in."""
    if not runc_root.is_dir():
        return
    for entry in runc_root.iterdir():
        subprocess.run(["runc", "--root", str(runc_root), "delete", "--force", entry.name],
                       capture_output=True, check=False, timeout=60)


def shims(address: str) -> list[int]:
    """containerd-shim processes started for this containerd (their command line names it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and b"containerd-shim" in cmd[0] and address.encode() in b" ".join(cmd):
            out.append(int(entry.name))
    return out


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below `folder`, deepest first."""
    prefix = str(folder)
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return sorted((p for p in points if p == prefix or p.startswith(prefix + "/")),
                  key=len, reverse=True)


# ---- one measured run: an empty node, a pull, then the first matmul ----------------------------

FIRST_STEP = ("import time; t = time.monotonic(); import torch; "
              "a = torch.randn(2048, 2048); (a @ a).sum().item(); "
              "print(round(time.monotonic() - t, 2))")


def cold_start(registry: str, ref: str, argv: tuple[str, ...] = ("python", "-c", FIRST_STEP),
               node: containerds.Containerd | None = None, empty_cache: bool = True,
               served: Sequence[Path] = ()) -> dict[str, Any]:
    """On a fresh private containerd (an empty content store and snapshotter) and, with
    `empty_cache`, an emptied page cache (a freshly booted node: `fresh_page_cache`) into
    which only the registry's `served` files are read back (a remote registry serves from its
    own memory): the CRI pull, then `ctr run` of a container that imports torch and runs a
    2048² matmul, started cold (the image's files evicted from the page cache, as on a node
    whose cache the pull did not fill: bench/workingset.py). Seconds of each, containerd's
    CPU-seconds over the pull, the bytes it fetched, the load before, and the working set the
    start read."""
    load = round(os.getloadavg()[0], 2)
    with PrivateContainerd([registry], node=node) as private:
        proc.run(["sync"])
        if empty_cache:
            fresh_page_cache()
            read_through(served)
        pulled = private.pull(ref)
        fetched = folder_bytes(private.home / "root" / "io.containerd.content.v1.content")
        cold = workingset.Measure(private.snapshots())
        start = time.monotonic()
        out = private.run(ref, *argv)
        started = round(time.monotonic() - start, 2)
        touched = cold.done()
    return {**pulled, "start_s": started, "in_container_s": float(out.split()[-1]),
            "to_matmul_s": round(pulled["s"] + started, 2), "bytes": fetched, "load": load,
            "page_cache": "emptied" if empty_cache else "kept", "working_set": touched}


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def can_empty_page_cache() -> None:
    """Refused up front, in one line, where the bench may not empty the page cache."""
    if not os.access(DROP_CACHES, os.W_OK):
        raise BuilderError(f"`{DROP_CACHES}` is not writable here: the CRI runs start each pull "
                           "with an emptied page cache", hint="run the bench as root, as "
                           "containerd needs anyway")


def fresh_page_cache() -> None:
    """The memory of a freshly booted node (after `sync`): the page cache and reclaimable
    slab emptied (`echo 3 > /proc/sys/vm/drop_caches`; root, as containerd is). Without it a
    pull's system time depends on what earlier runs left cached: measured here, the same pull
    cost containerd 3.7-5.0 more system seconds after them, gzip and zstd alike."""
    try:
        DROP_CACHES.write_text("3")
    except OSError as exc:
        raise BuilderError(f"`{DROP_CACHES}`: {exc.strerror}",
                           hint="run the bench as root") from exc


def read_through(paths: Sequence[Path]) -> None:
    """Each file read once, so its pages are cached."""
    for path in paths:
        with path.open("rb") as fh:
            while fh.read(1 << 20):
                pass


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
