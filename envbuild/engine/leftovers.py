"""Which stopped envbuild containers a dead run left behind, decided without the engine.

Several envbuild runs may share one engine (parallel CI jobs on one runner): each removes only
what no live run still needs. The policy is a pure function of the container's inspect document
and the time, with its two probes injected (is a run still alive; does a build server still
answer), so that every rule is a unit test.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from envbuild.core.interrupt import RUN_LABEL, RUN_PLACE_LABEL, run_alive
from envbuild.core.labels import SERVE_ARG, STAGE


def _created_at(created: object) -> float:
    """Epoch seconds of the engine's `Created` time stamp (0 when it cannot be read)."""
    text = str(created or "").rstrip("Z").split(".")[0]
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def _env_value(env: object, name: str) -> str | None:
    """The value of `name` in a container's Config.Env list."""
    for item in env if isinstance(env, list) else []:
        key, _, value = str(item).partition("=")
        if key == name:
            return value
    return None


def build_server_answers(url: str) -> bool | None:
    """Whether envbuild's build server at `url` still accepts connections: False when refused
    (its run's build is over), None when this host cannot tell (no route, a timeout, a bad URL)."""
    try:
        parsed = urllib.parse.urlsplit(url)
        host, port = parsed.hostname, parsed.port
    except ValueError:
        return None
    if not host or not port:
        return None
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


# Exit codes of a container killed when its engine came back (137), or lost with the machine
# (255). A container whose command ended by itself meanwhile ends with its own code.
_LOST_WITH_THE_ENGINE = (137, 255)
# A live run removes its stopped containers within seconds (the builder commits the install
# step's and removes it; a smoke run reads its output and removes it); one stopped this long
# ago belongs to a run that died, wherever it ran.
LIVE_RUN_GRACE_S = 600.0
# A container created but not started yet: its run may be about to start it.
UNSTARTED_GRACE_S = 120.0


def left_behind(
    attrs: dict[str, Any],
    *,
    now: float,
    alive: Callable[[str, str], bool | None] = run_alive,
    serving: Callable[[str], bool | None] = build_server_answers,
) -> bool:
    """Whether a stopped envbuild container (the engine's inspect document) can only have been
    left by a dead run. One that another live run still needs is not: the install step's being
    committed by its builder, a smoke container whose run is reading its output. `alive(run id,
    place)` says whether a run still runs, `serving(url)` whether the build server an install
    step was given still answers (the run's server lives exactly as long as its build); None:
    cannot tell from here."""
    state = attrs.get("State") or {}
    status = state.get("Status") if isinstance(state, dict) else state
    if status == "dead":
        return True
    if status == "created":
        made = _created_at(attrs.get("Created"))
        return made > 0 and now - made > UNSTARTED_GRACE_S
    if status != "exited" or not isinstance(state, dict):
        return False
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    code = state.get("ExitCode")
    if code in _LOST_WITH_THE_ENGINE and not state.get("OOMKilled"):
        return True
    if labels.get(STAGE) in ("install", "builder"):
        if code != 0:
            return True  # a failed step: its builder removes it too, it is never committed
        served = _env_value(config.get("Env"), SERVE_ARG)
        if served and serving(served) is False:
            return True  # its run's build is over (the engine that ran it died meanwhile)
    run = labels.get(RUN_LABEL)
    if run and alive(str(run), str(labels.get(RUN_PLACE_LABEL, ""))) is False:
        return True
    finished = _created_at(state.get("FinishedAt"))
    return finished > 0 and now - finished > LIVE_RUN_GRACE_S
