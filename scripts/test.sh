#!/usr/bin/env bash
# The test suite: prepare the host (engine, base image, wheelhouse), then the Docker-free tiers
# (unit, hostile) on every core, then the integration and end-to-end tiers against the real
# engine: in two lanes (a module per lane at a time; they wait on the network and the disk as
# much as on the CPU), then the tests marked `alone` (they kill the engine, or measure) by
# themselves. Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/host-setup.sh
# A bare Debian base (no python3): the tests also exercise installing the OS's own Python.
# Bootstrapped while the linters run: one waits on the network and the disk, the others on the CPU.
.venv/bin/envbuild base bootstrap --suite bookworm --tag envbuild/base:bookworm &
bootstrap=$!
.venv/bin/ruff check envbuild tests
.venv/bin/mypy
wait "$bootstrap"
# A short --basetemp: messages shorten long paths, and xdist adds a folder per worker.
.venv/bin/python -m pytest tests/unit tests/hostile -n 2 --basetemp=/tmp/envbuild-tests "$@"
# The lanes and the run after them share what a session makes once (tests/support/docker_support.py).
shared=$(mktemp -d /tmp/envbuild-tests-shared.XXXXXX)
trap 'rm -rf "$shared"' EXIT
status=0
ENVBUILD_TEST_SHARED=$shared ENVBUILD_TEST_KEEP_IMAGES=1 .venv/bin/python -m pytest \
    tests/integration tests/e2e -n 2 --dist loadfile -m "not alone" "$@" || status=$?
# Run even when a lane failed: it reports its own failures, and removes what the tests made.
ENVBUILD_TEST_SHARED=$shared .venv/bin/python -m pytest tests/integration tests/e2e -m alone "$@" \
    || status=$((status ? status : $?))
exit "$status"
