#!/usr/bin/env bash
# The main job, end to end: prepare the host, then build and smoke-test the default CPU torch
# image (torch 2.13.0, Python 3.11, Debian bookworm) with no network: the base image comes from
# debootstrap and every wheel from ./wheelhouse. Once the host is set up, this runs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/host-setup.sh
.venv/bin/envbuild base bootstrap --suite bookworm --with-python --tag envbuild/base:bookworm-python
exec .venv/bin/envbuild build --framework torch --framework-version 2.13.0 --cuda cpu --python 3.11 \
  --base-image envbuild/base:bookworm-python --wheelhouse wheelhouse --offline --report envbuild-report.json "$@"
