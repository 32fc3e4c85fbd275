#!/usr/bin/env bash
# Prepare a Debian host (as root) for envbuild and its tests:
#   a Docker engine (installed and started when `docker info` fails), debootstrap,
#   a virtual environment at .venv with envbuild and its test tools, and ./wheelhouse
#   holding the torch CPU wheel the default CPU image is built from, with its dependencies.
# Base images are made by the callers (scripts/main-job.sh, scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'host-setup: %s\n' "$*" >&2; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
# A registry server, htpasswd and skopeo for the publish tests.
command -v docker-registry >/dev/null 2>&1 || need_apt+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || need_apt+=(apache2-utils)
command -v skopeo >/dev/null 2>&1 || need_apt+=(skopeo)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# A headless browser (and a font for its text) for the test that opens `bench --html`'s report.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
if ((${#need_apt[@]})); then
  say "installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  # A dockerd that was killed leaves its pid file behind, and a new one refuses to start.
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
  fi
  say "starting dockerd (log: /var/log/envbuild-dockerd.log)"
  nohup dockerd >/var/log/envbuild-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "dockerd did not come up; see /var/log/envbuild-dockerd.log"; exit 1; }
fi

if [ ! -x .venv/bin/envbuild ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

bash scripts/wheelhouse.sh
# Bookworm's skopeo cannot verify cosign signatures; the signing tests use trixie's.
bash scripts/skopeo-sigstore.sh >/dev/null
# What the tests of other engines need (rootless Docker, Podman, docker-in-docker): one script each.
for setup in scripts/engines/*-setup.sh; do
  if [ -e "$setup" ]; then bash "$setup"; fi
done
