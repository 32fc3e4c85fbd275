#!/usr/bin/env bash
# The test suite: prepare the host (engine, base image, wheelhouse), then the Docker-free tiers
# (unit, hostile) on every core, then the integration and end-to-end tiers against the real
# engine, one test at a time (they share it, and some kill it). Extra arguments go to pytest.
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
exec .venv/bin/python -m pytest tests/integration tests/e2e "$@"
