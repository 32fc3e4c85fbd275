"""The hostile tier: whole `envbuild` processes and the registry client against real adversarial
servers on loopback (stalls, drips, redirects, floods), with real deadlines. No Docker: any attempt
to reach an engine fails the test, as in the unit tier. Kept apart from tests/unit because the
deadlines are real seconds and every CLI case starts a process; the unit tier stays fast.

`_no_docker` guards this process only. A case that runs `envbuild` against an engine gives it a
fake one on loopback (tests/support/hostile_engine.py) in DOCKER_HOST, never the real engine's."""

from __future__ import annotations

from tests.unit.conftest import (
    _no_docker,  # noqa: F401 - autouse fixture, found by name
    _own_cache,  # noqa: F401 - autouse fixture, found by name
)
