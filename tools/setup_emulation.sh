#!/usr/bin/env bash
# Idempotent: run foreign-architecture (linux/arm64) images and bootstraps on this machine through
# qemu-user-static and binfmt_misc. Needed for emulated arm64 builds (`python -m bench arm64`,
# `builder build --select platform=linux/arm64` on an x86 host); a native arm64 host needs none.
set -euo pipefail

need=()
for pkg in qemu-user-static binfmt-support arch-test; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup_emulation: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# In a container or VM without systemd, binfmt_misc may not be mounted yet.
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
# F (fix binary): the interpreter is opened now, so it also works inside containers.
grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
  || { echo "setup_emulation: qemu-aarch64 is registered without the F flag"; exit 1; }
echo "setup_emulation: linux/arm64 runs here under qemu"
