"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.knowledge import load_knowledge
from envbuild.models import Knowledge

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def knowledge() -> Knowledge:
    return load_knowledge()
