#!/usr/bin/env bash
# The test suite: prepare the host (engine, base image, wheelhouse), then unit, integration and
# end-to-end tests against the real engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/host-setup.sh
# A bare Debian base (no python3): the tests also exercise installing the OS's own Python.
.venv/bin/envbuild base bootstrap --suite bookworm --tag envbuild/base:bookworm
.venv/bin/ruff check envbuild tests
.venv/bin/mypy
exec .venv/bin/python -m pytest tests "$@"
