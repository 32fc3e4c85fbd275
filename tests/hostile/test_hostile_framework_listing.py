"""A framework image found under its tag is any image: what its container prints as its
installed distributions is hostile input. Whatever it prints (no `==`, control characters,
huge names, bad encoding, thousands of lines), the check answers one bounded line or, only for
exactly the lock's distributions, None; it never raises.

Generated: listings of arbitrary text, and of the lock's own lines with one changed."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.build.entry import framework_problem
from envbuild.core import labels
from envbuild.core.models import FrameworkImage
from envbuild.engine.interface import RunResult
from tests.support.engine_double import InMemoryEngine

LOCK = "".join(
    f"{pin} \\\n    --hash=sha256:{hashlib.sha256(pin.encode()).hexdigest()}\n"
    for pin in ("filelock==3.0.0", "torch==2.13.0+cpu")
)
WANTED = FrameworkImage(
    key="k" * 64, ref="envbuild/framework:torch-2.13.0-cpu-kkkk", dockerfile="", lock=LOCK,
    title="torch 2.13.0+cpu",
)  # fmt: skip


def check(stdout: str) -> str | None:
    engine = InMemoryEngine()
    image_id = engine.add_image("found", labels={labels.FRAMEWORK_KEY: WANTED.key})
    engine.outputs[image_id] = RunResult(
        exit_code=0, stdout=stdout, stderr="", timed_out=False, seconds=0.0
    )
    found = engine.image(image_id)
    assert found is not None
    return framework_problem(engine, WANTED, found)


@settings(max_examples=300)
@given(st.text(max_size=2000))
def test_any_listing_is_one_bounded_line_or_exactly_the_lock(stdout: str) -> None:
    said = check(stdout)
    if said is not None:
        assert "\n" not in said
        assert len(said) < 1000


@given(
    st.sampled_from(["filelock==3.0.0", "torch==2.13.0+cpu"]),
    st.text(min_size=1, max_size=100_000).filter(lambda t: "\n" not in t and "\r" not in t),
)
def test_a_changed_line_of_any_size_is_refused_in_one_bounded_line(kept: str, other: str) -> None:
    said = check(f"{kept}\n{other}==1\n")
    assert said is not None
    assert "\n" not in said
    assert len(said) < 1000


def test_the_locks_distributions_and_the_venvs_seeds_pass() -> None:
    assert check("filelock==3.0.0\ntorch==2.13.0+cpu\npip==23.0.1\n") is None
    assert check("torch==2.13.0+cpu\nfilelock==3.0.0\n") is None


def test_too_many_lines_are_refused_without_reading_them_as_distributions() -> None:
    said = check("x==1\n" * 20_000)
    assert said == "it lists more than 10000 distributions"


def test_a_huge_name_is_shown_cut() -> None:
    said = check("filelock==3.0.0\ntorch==2.13.0+cpu\n" + "a" * 100_000 + "==1\n")
    assert said is not None
    assert said.startswith("its distributions differ from framework.lock: + aaa")
    assert len(said) < 1000
