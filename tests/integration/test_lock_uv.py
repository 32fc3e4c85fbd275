"""Locks resolved by the real uv against the live PyPI, and offline against a real wheelhouse.

Marked `live`: it reads PyPI (deselect with -m 'not live'). No Docker.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.core.models import BuildOptions, Entry, Knowledge, Selection
from envbuild.knowledge.load import load_knowledge
from envbuild.lock.lockfile import pins, update_lock
from envbuild.plan.matrix import knowledge_matrix, load_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def knowledge() -> Knowledge:
    return load_knowledge()


def entry_of(knowledge: Knowledge, version: str, cuda: str, packages: tuple[str, ...]) -> Entry:
    selection = Selection(framework="torch", framework_version=version, cuda=cuda)
    defaults = load_matrix(default_matrix_path(), knowledge)
    matrix = knowledge_matrix(knowledge, selection, defaults)
    (entry,) = make_plan(knowledge, matrix, selection).entries
    return dataclasses.replace(entry, packages=packages)


def test_torch_241_with_numpy_and_transformers_resolves_with_hashes(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    entry = entry_of(knowledge, "2.4.1", "12.1", ("numpy", "transformers"))
    update = update_lock(entry, BuildOptions(), knowledge, matrix_path=tmp_path / "team.yaml")
    pinned = pins(update.text)
    assert pinned["torch"] == "2.4.1"
    assert {"numpy", "transformers", "tokenizers", "nvidia-cudnn-cu12"} <= set(pinned)
    assert update.text.count("--hash=sha256:") >= len(pinned)
    assert update.unresolvable is None


def test_a_package_needing_another_torch_is_unresolvable_naming_torch(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    # torchvision 0.20.0 requires torch==2.5.0. (transformers>=4.50 does not conflict: its
    # torch is an optional extra.)
    entry = entry_of(knowledge, "2.4.1", "12.1", ("numpy", "torchvision==0.20.0"))
    update = update_lock(entry, BuildOptions(), knowledge, matrix_path=tmp_path / "team.yaml")
    assert update.unresolvable is not None
    assert "torch==2.5.0" in update.unresolvable
    assert "torch==2.4.1" in update.unresolvable
    assert pins(update.text) == {}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheelhouse")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder),
        "--only-binary=:all:", "--python-version", "3.11",
        "--platform", "manylinux_2_28_x86_64", "torch==2.13.0+cpu", "numpy", "six",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot download the wheels: {done.stderr.strip().splitlines()[-1:]}")
    return folder


def test_an_offline_lock_from_a_local_wheelhouse(
    knowledge: Knowledge, wheelhouse: Path, tmp_path: Path
) -> None:
    entry = entry_of(knowledge, "2.13.0", "cpu", ("numpy", "six"))
    options = BuildOptions(wheelhouse=wheelhouse, offline=True)
    update = update_lock(entry, options, knowledge, matrix_path=tmp_path / "team.yaml")
    pinned = pins(update.text)
    assert pinned["torch"] == "2.13.0+cpu"
    assert {"numpy", "six"} <= set(pinned)
    assert "--hash=sha256:" in update.text
