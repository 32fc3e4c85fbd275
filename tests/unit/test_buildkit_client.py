"""The docker client envbuild builds with: bounded in time even when it says nothing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from envbuild.engine import buildkit


def client(tmp_path: Path, script: str) -> buildkit.Client:
    path = tmp_path / "docker"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return buildkit.Client(path=str(path), version="20.10.24", buildx=False)


def test_a_silent_client_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    # Stopped, not waited for: SIGINT, then (where SIGINT is ignored, as an xdist worker's
    # children inherit) a kill after the cancel grace; far less than the client would take.
    silent = client(tmp_path, "exec sleep 600")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        buildkit._run([silent.path], {}, lambda line: None, timeout=0.5)
    assert time.monotonic() - started < 300


def test_a_client_that_talks_past_its_deadline_is_stopped(tmp_path: Path) -> None:
    chatty = client(tmp_path, "while :; do echo step; sleep 0.05; done")
    lines: list[str] = []
    with pytest.raises(subprocess.TimeoutExpired):
        buildkit._run([chatty.path], {}, lines.append, timeout=0.5)
    assert lines


def test_an_engine_too_busy_to_answer_the_probe_is_not_one_without_buildkit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(buildkit, "_PROBE_SECONDS", 0.2)
    assert buildkit.probe(client(tmp_path, "exec sleep 60"), "the engine at test") == ""
    assert "did not finish an empty BuildKit build in 0.6 s (busy?)" in caplog.text


def test_a_client_that_fails_the_probe_says_why(tmp_path: Path) -> None:
    failing = client(
        tmp_path, 'echo "ERROR: BuildKit is enabled but the buildx component is missing"; exit 1'
    )
    problem = buildkit.probe(failing, "the engine at test")
    assert problem
    assert "buildx" in problem


def test_a_client_that_succeeds_passes_the_probe(tmp_path: Path) -> None:
    assert buildkit.probe(client(tmp_path, "exit 0"), "the engine at test") == ""
