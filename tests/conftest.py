"""Shared test helpers; the Docker fixtures of the integration and e2e tiers live in docker_support."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.knowledge import load_knowledge
from envbuild.models import Knowledge
from tests.docker_support import (  # noqa: F401 - fixtures, found by name
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
