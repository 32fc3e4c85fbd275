"""Shared test helpers; the Docker fixtures of the integration and e2e tiers live in tests/support/docker_support.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.core.models import Knowledge
from envbuild.knowledge.load import load_knowledge
from tests.support.docker_support import (  # noqa: F401 - fixtures, found by name
    base_image,
    ca_bundle,
    cpu_matrix,
    docker_client,
    engine,
    isolated_data_dir,
    shared_registry,
    torch_cpu_build,
    wheelhouse,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def knowledge() -> Knowledge:
    return load_knowledge()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that needs the engine to itself cannot run beside another lane. (Lanes are
    `-n 2 --dist loadfile`: a module runs whole, in order, on one lane, as its module fixtures
    and its tests that follow from the one before need. Not `loadgroup`: with pytest 9.2 and
    xdist 3.8 its groups silently stop taking effect, pytest-xdist issue #1386.)"""
    if item.get_closest_marker("alone") and hasattr(item.config, "workerinput"):
        pytest.fail(
            "marked alone (it kills the engine, or measures): run it without -n, after the "
            "lanes (scripts/test.sh does; select it with -m alone)",
            pytrace=False,
        )
