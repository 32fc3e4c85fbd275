#!/usr/bin/env bash
# What the rootless Docker engine of the tests needs (tests/support/rootless_engine.py), as root:
#   Debian's rootlesskit, slirp4netns (the engine's network), uidmap (newuidmap/newgidmap, setuid,
#   to map the user's subordinate ids) and fuse-overlayfs (a fallback storage driver), and the
#   unprivileged user envbuild-rootless that runs the engine, with subordinate uid and gid ranges.
# dockerd-rootless.sh itself comes with docker.io (/usr/share/docker.io/contrib/).
# Idempotent and quiet: a second run changes nothing and prints nothing.
set -euo pipefail

user=envbuild-rootless
say() { printf 'rootless-setup: %s\n' "$*" >&2; }

# shellcheck source=scripts/engines/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
need_apt=()
command -v rootlesskit >/dev/null 2>&1 || need_apt+=(rootlesskit)
command -v slirp4netns >/dev/null 2>&1 || need_apt+=(slirp4netns)
command -v newuidmap >/dev/null 2>&1 || need_apt+=(uidmap)
command -v fuse-overlayfs >/dev/null 2>&1 || need_apt+=(fuse-overlayfs)
apt_install "${need_apt[@]}"
[ -x /usr/share/docker.io/contrib/dockerd-rootless.sh ] \
  || { say "no /usr/share/docker.io/contrib/dockerd-rootless.sh: install Debian's docker.io"; exit 1; }

if ! getent passwd "$user" >/dev/null; then
  say "creating user $user"
  # A home of its own: dockerd-rootless.sh reads $HOME, and the engine's data root may live there.
  useradd --create-home --shell /usr/sbin/nologin --comment "envbuild rootless Docker (tests)" "$user"
fi
# useradd allocates the ranges from login.defs for a new user, but not for one made before
# uidmap was installed or by other means: add 65536 of each where the user has none.
next_free_range() {
  # The first 65536-id range above 100000 that no line of $1 overlaps.
  awk -F: 'BEGIN { start = 100000 }
           { end = $2 + $3; if (end > start) start = end }
           END { printf "%d-%d\n", start, start + 65535 }' "$1"
}
for file in /etc/subuid /etc/subgid; do
  if ! grep -q "^$user:" "$file"; then
    range=$(next_free_range "$file")
    say "giving $user the subordinate ids $range in $file"
    if [ "$file" = /etc/subuid ]; then usermod --add-subuids "$range" "$user"; else usermod --add-subgids "$range" "$user"; fi
  fi
done

# slirp4netns, the engine's network, opens /dev/net/tun as the user (inside its user namespace).
# Debian's udev makes the node 0666 (50-udev-default.rules); a host without udev, as this one,
# keeps the kernel's root-only 0600 and rootlesskit fails with "open: Permission denied".
[ -e /dev/net/tun ] || modprobe tun 2>/dev/null || true
if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
  say "making /dev/net/tun 0666, as udev does"
  chmod 0666 /dev/net/tun
fi
