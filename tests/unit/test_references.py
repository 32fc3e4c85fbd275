"""One home for splitting an image reference: NAME[:TAG][@DIGEST], where a port is no tag."""

from __future__ import annotations

import pytest

from envbuild.core.names import image_reference_problem, shown, split_tag
from envbuild.registry import parse_reference
from envbuild.registry.errors import BadReference

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("reference", "name", "tag"),
    [
        ("envbuild/torch:2.13.0-cpu", "envbuild/torch", "2.13.0-cpu"),
        ("envbuild/torch", "envbuild/torch", None),
        ("localhost:5000/team/torch", "localhost:5000/team/torch", None),
        ("localhost:5000/team/torch:1", "localhost:5000/team/torch", "1"),
        (f"localhost:5000/team/torch@{DIGEST}", "localhost:5000/team/torch", None),
        (f"localhost:5000/team/torch:1@{DIGEST}", "localhost:5000/team/torch", "1"),
        ("[::1]:5000/x:y", "[::1]:5000/x", "y"),
        ("torch:", "torch", ""),
    ],
)
def test_split_tag(reference: str, name: str, tag: str | None) -> None:
    assert split_tag(reference) == (name, tag)


def test_an_empty_tag_is_a_problem_everywhere_it_is_parsed() -> None:
    assert image_reference_problem("envbuild/torch:") is not None
    with pytest.raises(BadReference, match="not a valid tag"):
        parse_reference("localhost:5000/team/torch:")


def test_a_port_is_not_taken_for_a_tag() -> None:
    assert image_reference_problem("localhost:5000/team/torch") is None
    ref = parse_reference("localhost:5000/team/torch")
    assert (ref.host, ref.repository, ref.tag) == ("localhost:5000", "team/torch", "latest")


@pytest.mark.parametrize("depth", [1, 5, 20, 200])
def test_a_long_path_is_cut_in_the_middle_keeping_its_file_name(depth: int) -> None:
    path = "/tmp/" + "/".join(f"folder-{i}" for i in range(depth)) + "/missing.pem"
    text = shown(path)
    assert "missing.pem" in text
    assert text.startswith("'/tmp/")
    assert len(text) <= 80 + 40  # the cut value, its quotes and the length note


def test_control_characters_are_escaped_on_both_sides_of_the_cut() -> None:
    text = shown("\x1b[31m" + "x" * 200 + "\r\n\u202e")
    for control in ("\x1b", "\r", "\n", "\u202e"):
        assert control not in text
