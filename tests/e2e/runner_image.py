"""The hosted runner's tools, for the workflow rehearsal (tests/e2e/actions_runner.py).

A job runs with a PATH of three folders: the rehearsal's shims (`sudo`), the job's own `tools/`
(what its steps install: `sudo apt-get install PKG` links PKG's commands, and those of the
packages it depends on, from this machine) and `runner-bin/` (the commands of GitHub's
ubuntu-24.04 image, runner_tools_ubuntu-24.04.txt, linked from this machine). A step that runs a
tool neither the image nor an earlier step provides fails with `command not found`, as it would
on GitHub.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TOOLS_LIST = Path(__file__).with_name("runner_tools_ubuntu-24.04.txt")
HOST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
BIN_DIRS = ("/bin/", "/sbin/")


def listed() -> tuple[list[str], list[str]]:
    """(apt packages, single commands) of the committed list."""
    packages, tools = [], []
    for line in TOOLS_LIST.read_text().splitlines():
        kind, _, name = line.partition(" ")
        if kind == "apt":
            packages.append(name.strip())
        elif kind == "tool":
            tools.append(name.strip())
    return packages, tools


def package_commands(package: str) -> list[Path]:
    """The commands this machine's `package` installed ([] when it is not installed)."""
    result = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return []
    found = [Path(p) for p in result.stdout.splitlines() if any(d in p for d in BIN_DIRS)]
    return [p for p in found if p.is_file() or p.is_symlink()]


def with_dependencies(package: str) -> list[str]:
    """`package` and what apt would install with it (Depends and Pre-Depends, recursively)."""
    result = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--installed", "--no-recommends",
         "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
         package], capture_output=True, text=True, check=False)
    names = [line.strip() for line in result.stdout.splitlines()
             if line and not line.startswith(" ")]
    return sorted({package, *(n for n in names if not n.startswith("<"))})


def link(folder: Path, command: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / command.name
    if not target.exists() and not target.is_symlink():
        target.symlink_to(command)


def make_runner_bin(root: Path) -> Path:
    """`root/runner-bin`: the runner image's commands, as far as this machine has them."""
    folder = root / "runner-bin"
    if folder.is_dir():
        return folder
    packages, tools = listed()
    for package in packages:
        for command in package_commands(package):
            link(folder, command)
    for tool in tools:
        if found := shutil.which(tool, path=HOST_PATH):
            link(folder, Path(found))
    return folder


def install(folder: Path, packages: list[str]) -> list[str]:
    """`apt-get install PACKAGES` for one job: their commands (and their dependencies') linked
    into its `tools/` folder. Returns the packages this machine does not have (apt's "Unable to
    locate package")."""
    absent = []
    for package in packages:
        if not package_commands(package) and subprocess.run(
                ["dpkg", "-s", package], capture_output=True, check=False).returncode != 0:
            absent.append(package)
            continue
        for name in with_dependencies(package):
            for command in package_commands(name):
                link(folder, command)
    return absent


APT_GET_SHIM = """#!/bin/sh
# `apt-get update|install` of a job's step (through `sudo`): the packages' commands are linked
# into the job's tools/ folder. mmdebstrap's own apt-get (APT_CONFIG set) is the real one.
if [ -n "${APT_CONFIG:-}" ]; then exec /usr/bin/apt-get "$@"; fi
for arg in "$@"; do
  case "$arg" in
    update) exit 0 ;;
    install) exec /usr/bin/python3 %(module)s "$REHEARSAL_TOOLS" "$@" ;;
  esac
done
exec /usr/bin/apt-get "$@"
"""


def make_apt_get_shim(shims: Path) -> None:
    shim = shims / "apt-get"
    shim.write_text(APT_GET_SHIM % {"module": Path(__file__).resolve()})
    shim.chmod(0o755)


GH_SHIM = """#!/bin/sh
case "$1 $2" in
  "pr list") exit 0 ;;
  "pr create"|"pr edit") ;;
  *) echo "gh $*: not stood in here" >&2; exit 1 ;;
esac
printf '== gh %%s\\n' "$*" >> '%(log)s'
prev=""
for arg in "$@"; do
  if [ "$prev" = --body-file ]; then cat "$arg" >> '%(log)s'; fi
  prev="$arg"
done
"""


def make_gh_shim(shims: Path, log: Path) -> None:
    """`gh pr list|create|edit`, GitHub's pull-request API stood in: none listed, the others
    recorded (arguments and body) in `log`."""
    shim = shims / "gh"
    shim.write_text(GH_SHIM % {"log": log})
    shim.chmod(0o755)


def main(argv: list[str]) -> int:
    """`runner_image.py TOOLS_DIR [apt-get arguments]`: the packages named after `install`."""
    folder, args = Path(argv[0]), argv[1:]
    names = [a for a in args[args.index("install") + 1:] if not a.startswith("-")]
    absent = install(folder, names)
    for name in absent:
        print(f"E: Unable to locate package {name}", file=sys.stderr)
    return 100 if absent else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
