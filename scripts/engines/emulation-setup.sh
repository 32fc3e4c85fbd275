#!/usr/bin/env bash
# What building linux/arm64 images on an x86_64 host needs (the `emulated` test tier), as root:
#   Debian's qemu-user-static, which registers qemu-aarch64 with binfmt_misc with the F flag
#   (containers need no qemu of their own), binfmt_misc mounted, and that entry enabled.
# `envbuild doctor` says whether it worked ("builds for linux/arm64: under emulation").
# Idempotent and quiet: a second run changes nothing and prints nothing.
set -euo pipefail

say() { printf 'emulation-setup: %s\n' "$*" >&2; }

[ "$(uname -m)" = x86_64 ] || exit 0  # an arm64 host builds arm64 natively
# shellcheck source=scripts/engines/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
need_apt=()
[ -x /usr/bin/qemu-aarch64-static ] || need_apt+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || need_apt+=(binfmt-support)
apt_install "${need_apt[@]}"
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
  say "mounting binfmt_misc"
  mount -t binfmt_misc binfmt_misc "$binfmt"
fi
if [ ! -e "$binfmt/qemu-aarch64" ] || ! grep -qx enabled "$binfmt/qemu-aarch64"; then
  say "enabling qemu-aarch64"
  update-binfmts --enable qemu-aarch64
fi
