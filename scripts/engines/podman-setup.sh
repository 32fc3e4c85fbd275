#!/usr/bin/env bash
# What the Podman engine of the tests needs (tests/support/podman_engine.py), as root:
#   Debian's podman (4.3 on bookworm; it brings conmon and runc), the CNI plugins its rootful
#   networks use when netavark is not installed (containernetworking-plugins: bridge,
#   host-local, firewall, portmap), and iptables for their NAT rules.
# The tests start `podman system service` themselves, with storage of their own: nothing is
# enabled or started here (the podman.socket unit the package installs needs systemd).
# Idempotent and quiet: a second run changes nothing and prints nothing.
set -euo pipefail

say() { printf 'podman-setup: %s\n' "$*" >&2; }

# shellcheck source=scripts/engines/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
need_apt=()
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
apt_install "${need_apt[@]}"
