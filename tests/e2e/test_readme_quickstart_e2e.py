"""The README's quick start (its first section), command by command, as a newcomer runs it: a
fresh clone of this checkout, a fresh state folder, the CPU image. `tools/setup.sh` is not run
again (it installs system packages and the venvs this test already runs in: its `.venv/bin` is
put on PATH instead), the registry address is moved to the session's registry (where setup.sh
starts one on 127.0.0.1:5000) and the repository is renamed (no README command may assume
`torch`). Afterwards the clone has nothing untracked: the key pair and the site are ignored.

The registry is a used one, as a team's is: the session's publication of the same CPU runtime is
already there under another repository, so `docker push` mounts the layers it pushed there
before instead of compressing 1.2 GB again (as it does on any registry it pushed them to) and
the zstd twin's layers come from the session's twin cache. Everything the README's commands
prove is still made here: the build (the build cache's layers), its smoke test and SBOM (the
state folder is empty), the key, the signed publication, its verification and the catalog."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fixtures_published import Publication
from helpers import PRIVATE_REPOSITORIES, ROOT, remove_images_of

pytestmark = pytest.mark.docker


def quick_start() -> list[str]:
    first = (ROOT / "README.md").read_text().split("\n## ", 2)[1]
    block = re.search(r"```sh\n(.*?)```", first, re.S)[1]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_each_quick_start_command_succeeds_in_order(shared_publication: Publication,
                                                    tmp_path: Path) -> None:
    steps = quick_start()
    clone, setup, path, *commands = steps
    assert clone.startswith("git clone ") and setup == "tools/setup.sh"
    assert path.startswith("export PATH=")
    work = tmp_path / "torch-images"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True, timeout=120)
    addr = shared_publication.addr
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
        remove_images_of(matrix)
