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
# qemu 7.2 (Debian 12) crashes in torch's aarch64 start-up (oneDNN's xbyak_aarch64 CPU probe:
# SIGSEGV, or a hang without faulthandler); qemu 10 runs it. On Debian 12 take it from backports.
qemu_major="$(dpkg-query -W -f='${Version}' qemu-user-static | sed -E 's/^[0-9]+://; s/\..*//')"
if [ "$qemu_major" -lt 8 ]; then
  . /etc/os-release
  echo "setup_emulation: qemu $qemu_major is too old for torch; installing it from ${VERSION_CODENAME}-backports"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$VERSION_CODENAME" > /etc/apt/sources.list.d/backports-qemu.sources
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t "${VERSION_CODENAME}-backports" \
    qemu-user-static >/dev/null
  # F-flag handlers keep the interpreter opened at registration: register the new one.
  update-binfmts --disable qemu-aarch64 || true
fi
# In a container or VM without systemd, binfmt_misc may not be mounted yet.
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
# F (fix binary): the interpreter is opened now, so it also works inside containers.
grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
  || { echo "setup_emulation: qemu-aarch64 is registered without the F flag"; exit 1; }
echo "setup_emulation: linux/arm64 runs here under qemu $(dpkg-query -W -f='${Version}' qemu-user-static)"
