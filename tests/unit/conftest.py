"""Unit tests never touch Docker: any attempt to reach an engine fails the test."""

from __future__ import annotations

import docker
import pytest


@pytest.fixture(autouse=True)
def _no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unit tests must not talk to Docker")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(docker.DockerClient, "__init__", refuse)
    monkeypatch.setattr(docker.APIClient, "__init__", refuse)
