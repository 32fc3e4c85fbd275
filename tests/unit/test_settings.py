"""Settings from the environment: a value that works, or one line naming the variable."""

from __future__ import annotations

import pytest

from envbuild.core.errors import BadInput
from envbuild.core.settings import seconds_setting


@pytest.mark.parametrize(
    ("text", "seconds"), [("", 7.0), (" ", 7.0), ("2.5", 2.5), ("86400", 86400.0)]
)
def test_seconds_within_a_day_are_taken(text: str, seconds: float) -> None:
    assert seconds_setting("ENVBUILD_X", 7, {"ENVBUILD_X": text}) == seconds
    assert seconds_setting("ENVBUILD_X", 7, {}) == 7


@pytest.mark.parametrize(
    "text", ["soon", "0", "-1", "nan", "inf", "86401", "1e9", "1_0x", "\x1b[31m5", "5" * 500]
)
def test_anything_else_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(BadInput) as caught:
        seconds_setting("ENVBUILD_X", 7, {"ENVBUILD_X": text})
    message = caught.value.message
    assert message.startswith("ENVBUILD_X=")
    assert "is not a number of seconds; set it to e.g. 7, or unset it" in message
    assert "\n" not in message
    assert "\x1b" not in message
