"""Settings envbuild reads from the environment, each checked the one way: a bad value is one
line naming the variable and a value that works."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from envbuild.core.errors import BadInput
from envbuild.core.names import shown

MAX_SECONDS = 86400  # a day: any longer is a typo, and a timer past it hides a hang


def seconds_setting(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The seconds in the environment variable `name` (0 < s <= a day), else `default`."""
    env = os.environ if environ is None else environ
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:  # NaN fails both comparisons
        msg = f"{name}={shown(text, 40)} is not a number of seconds; set it to e.g. {default:g}, or unset it"
        raise BadInput(msg)
    return seconds
