"""The README's quick start (its first section), command by command, as a newcomer runs it: a
fresh clone of this checkout, a fresh state folder, the CPU image. `tools/setup.sh` is not run
again (it installs system packages and the venvs this test already runs in: its `.venv/bin` is
put on PATH instead), the registry address is moved to a free port, with a registry of this
test started there as setup.sh starts one on 127.0.0.1:5000, and the repository is renamed (no
README command may assume `torch`). Afterwards the clone has nothing untracked: the key pair
and the site are ignored."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import PRIVATE_REPOSITORIES, ROOT, free_port, remove_images_of

from builder.core import registry

pytestmark = pytest.mark.docker


def quick_start() -> list[str]:
    first = (ROOT / "README.md").read_text().split("\n## ", 2)[1]
    block = re.search(r"```sh\n(.*?)```", first, re.S)[1]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_each_quick_start_command_succeeds_in_order(tmp_path: Path) -> None:
    steps = quick_start()
    clone, setup, path, *commands = steps
    assert clone.startswith("git clone ") and setup == "tools/setup.sh"
    assert path.startswith("export PATH=")
    work = tmp_path / "torch-images"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True, timeout=120)
    addr = f"127.0.0.1:{free_port()}"
    matrix = work / "matrix.yaml"
    repository = f"e2e-{uuid.uuid4().hex[:8]}-torch"
    PRIVATE_REPOSITORIES.add(repository)  # conftest removes what is left of it
    matrix.write_text(matrix.read_text()
                      .replace("registry: 127.0.0.1:5000", f"registry: {addr}", 1)
                      .replace("\nrepository: torch\n", f"\nrepository: {repository}\n", 1))
    assert repository in matrix.read_text()
    env = {**os.environ, "BUILDER_STATE": str(tmp_path / "state"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.update({k: v for k, v in re.findall(r"(\w+)=(\S+)", path) if k != "PATH"})
    registry.start(addr, tmp_path / "state" / "registry")
    try:
        for command in commands:
            argv = shlex.split(command.replace("127.0.0.1:5000", addr))
            assert argv[0] == "builder"
            result = subprocess.run([sys.executable, "-m", "builder", *argv[1:]], cwd=work,
                                    env=env, capture_output=True, text=True, timeout=3600,
                                    check=False)
            assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n" \
                f"{result.stderr[-3000:]}"
        assert (work / "site" / "index.html").is_file() and (work / "cosign.pub").is_file()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                                cwd=work, capture_output=True, text=True, check=True).stdout
        assert [line for line in status.splitlines() if not line.startswith(" M ")] == []
    finally:
        registry.stop(tmp_path / "state" / "registry")
        remove_images_of(matrix)
