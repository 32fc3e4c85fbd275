#!/usr/bin/env bash
# Fill ./wheelhouse with the torch CPU wheel (Python 3.11, x86_64), every wheel it depends
# on and numpy, so the default CPU image can then be built with no network at all (`build --offline`).
# The torch wheel: pip's configured find-links first (a local copy, if the host has one), then
# PyTorch's CPU index (ENVBUILD_TORCH_CPU_INDEX for a mirror). Its dependencies: PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${ENVBUILD_TORCH_CPU_VERSION:-2.13.0}"
mkdir -p wheelhouse
target=(--disable-pip-version-check --only-binary=:all: --python-version 3.11
        --platform manylinux_2_28_x86_64 --dest wheelhouse)
if ! ls "wheelhouse/torch-${VERSION}+cpu-cp311-"*.whl >/dev/null 2>&1; then
  if ! .venv/bin/pip download "${target[@]}" --no-deps --no-index "torch==${VERSION}+cpu" >/dev/null 2>&1; then
    .venv/bin/pip download "${target[@]}" --no-deps --index-url "${ENVBUILD_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" "torch==${VERSION}+cpu"
  fi
fi
# The dependencies, resolved against the wheel just fetched (pip reads its metadata), and numpy,
# which every image carries unless its matrix says `numpy: false`.
.venv/bin/pip download -q "${target[@]}" --find-links wheelhouse "torch==${VERSION}+cpu" numpy
ls wheelhouse
