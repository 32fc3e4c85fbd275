#!/usr/bin/env bash
# The test suite: prepare the host (engine, base image, wheelhouse), then the Docker-free tiers
# (unit, hostile) in four workers (many of their tests wait on a timeout, not the CPU), then the
# integration and end-to-end tiers against the real engine: in two lanes (a module per lane at a
# time; they wait on the network and the disk as much as on the CPU), then the tests marked
# `alone` (they kill the engine, or measure) by themselves; first the main tier, then the
# extended one (tests marked `extended`).
# Last, the emulated tier (tests marked `emulated`: linux/arm64 images built and smoke-tested
# under qemu, about 10 times slower than the host's own).
# ENVBUILD_TEST_TIER=main|extended|emulated|all (default all). Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/host-setup.sh
# The engine's disk, which the tests fill with gigabytes: what an earlier run left goes first
# (images the tests made, untagged ones, BuildKit's cache beyond a bound), and again between
# the tiers (where the images the main tier kept for the extended one stay). The bound keeps a
# warm cache for the builds the tiers repeat.
free_engine_disk() {  # $1: "images" to remove the test images too
  if [ "${1:-}" = images ]; then
    docker images -q --filter label=org.envbuild.test | sort -u | xargs -r docker rmi -f >/dev/null 2>&1 || true
    docker images -q 'envbuild-test/*' | sort -u | xargs -r docker rmi -f >/dev/null 2>&1 || true
    docker images -q 'envbuild/framework' | sort -u | xargs -r docker rmi -f >/dev/null 2>&1 || true
  fi
  docker image prune -f >/dev/null || true
  docker builder prune -f --keep-storage 8GB >/dev/null || true
  echo "test.sh: $(df -h --output=avail /var/lib/docker | tail -1 | tr -d ' ') free for the engine" >&2
}
free_engine_disk images
# A bare Debian base (no python3): the tests also exercise installing the OS's own Python.
# Bootstrapped while the linters run: one waits on the network and the disk, the others on the CPU.
.venv/bin/envbuild base bootstrap --suite bookworm --tag envbuild/base:bookworm &
bootstrap=$!
.venv/bin/ruff check envbuild tests
.venv/bin/mypy
wait "$bootstrap"
# The lanes and the runs after them share what a session makes once (tests/support/docker_support.py).
shared=$(mktemp -d /tmp/envbuild-tests-shared.XXXXXX)
trap 'rm -rf "$shared"' EXIT
# uv on the host unpacks a local wheel into its cache once per folder it is found in (700 MB for
# torch), and the tests' wheelhouses are temporary folders: a cache of the run's own, removed with it.
export UV_CACHE_DIR="$shared/uv"
# A short --basetemp: messages shorten long paths, and xdist adds a folder per worker.
args=("$@")
case "${ENVBUILD_TEST_TIER:-all}" in
  all|main) .venv/bin/python -m pytest tests/unit tests/hostile -n 4 --basetemp=/tmp/envbuild-tests "$@";;
esac
status=0
# Two tiers of engine tests: main, then extended (fault injection, a corporate network, the
# CUDA download, bench: tests marked `extended`), each in lanes, then its `alone` tests.
# ENVBUILD_TEST_TIER=main or extended runs one of them; the default runs both, main first.
tier="${ENVBUILD_TEST_TIER:-all}"
case "$tier" in main|extended|emulated|all) ;; *) echo "ENVBUILD_TEST_TIER=$tier: use main, extended, emulated or all" >&2; exit 2;; esac
engine_tier() {  # $1: the marker expression of the tier; $2: keep the images for a later tier
  local selection=$1 keep=$2 code=0
  ENVBUILD_TEST_SHARED=$shared ENVBUILD_TEST_KEEP_IMAGES=1 .venv/bin/python -m pytest \
      tests/integration tests/e2e -n 2 --dist loadfile -m "($selection) and not alone" "${args[@]}" || code=$?
  free_engine_disk  # the `alone` tests include the CUDA build (6 GB in the image, as much again while it commits)
  # Run even when a lane failed: it reports its own failures, and (last) removes what the tests made.
  ENVBUILD_TEST_SHARED=$shared ENVBUILD_TEST_KEEP_IMAGES=$keep .venv/bin/python -m pytest \
      tests/integration tests/e2e -m "($selection) and alone" "${args[@]}" || code=$((code ? code : $?))
  return "$code"
}
if [ "$tier" = all ] || [ "$tier" = main ]; then
  engine_tier "not extended and not emulated" "$([ "$tier" = all ] && echo 1)" || status=$?
  echo "test.sh: main tier done after $SECONDS s (exit $status)" >&2
fi
if [ "$tier" = all ] || [ "$tier" = extended ]; then
  [ "$tier" = all ] && free_engine_disk
  engine_tier "extended and not emulated" "" || status=$((status ? status : $?))
  echo "test.sh: extended tier done after $SECONDS s (exit $status)" >&2
fi
if [ "$tier" = all ] || [ "$tier" = emulated ]; then
  [ "$tier" = all ] && free_engine_disk images
  # One module, its tests in order, by itself: emulation takes every core.
  ENVBUILD_TEST_SHARED=$shared .venv/bin/python -m pytest tests/integration tests/e2e \
      -m emulated "${args[@]}" || status=$((status ? status : $?))
  echo "test.sh: emulated tier done after $SECONDS s (exit $status)" >&2
fi
exit "$status"
