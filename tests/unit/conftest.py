"""Unit tests never touch Docker: any attempt to reach an engine fails the test."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from envbuild.core.store import ResultStore
from tests.support.engine_double import InMemoryEngine


@pytest.fixture(autouse=True)
def _no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unit tests must not talk to Docker")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(docker.DockerClient, "__init__", refuse)
    monkeypatch.setattr(docker.APIClient, "__init__", refuse)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own $XDG_CACHE_HOME: locks and build logs never leak between tests or
    into the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultStore:
    """A result store of the test's own; build logs in its folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # build logs
    return ResultStore(tmp_path / "results.sqlite3")


@pytest.fixture
def double() -> InMemoryEngine:
    """An empty in-memory engine (tests/support/engine_double.py)."""
    return InMemoryEngine()
