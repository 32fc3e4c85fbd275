"""The classic builder's labels as one LABEL instruction of the Dockerfile sent
(docker_engine.labelled_dockerfile): the same labels, or the API's way when they cannot be
written there as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from envbuild.engine.docker_engine import labelled_dockerfile

DOCKERFILE = "FROM envbuild/base:bookworm\nRUN true\n"
# What a label may hold and still be written in single quotes: printable (Python's sense: no
# control character, no space but " "), no quote.
WRITABLE = st.text(st.characters(blacklist_characters="'"), max_size=40).filter(str.isprintable)


# A Dockerfile that ends in a LABEL of its own, as envbuild's do.
OWN_LABEL = (
    'FROM envbuild/base:bookworm\nRUN true\nLABEL org.envbuild.stage="image" \\\n'
    '      org.envbuild.user="1000:1000"\n'
)


@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, OWN_LABEL], ids=["ends-in-run", "ends-in-label"]
)
@given(labels=st.dictionaries(WRITABLE.filter(bool), WRITABLE, min_size=1, max_size=6))
@example(labels={"0": "LABEL"})  # the word in a value is no instruction
def test_writable_labels_are_one_label_instruction_at_the_dockerfiles_end(
    tmp_path_factory: pytest.TempPathFactory, dockerfile: str, labels: dict[str, str]
) -> None:
    """A LABEL of their own after a Dockerfile that ends otherwise; added to the Dockerfile's
    own last LABEL when it ends in one (the classic builder makes a step of each instruction)."""
    path = tmp_path_factory.mktemp("context") / "Dockerfile"
    path.write_text(dockerfile)
    text = labelled_dockerfile(path, labels)
    assert text is not None
    assert text.startswith(dockerfile.rstrip("\n"))
    assert text.count("\nLABEL ") == 1  # a label may hold the word; no line break
    # The last instruction as the builder reads it: its continued lines joined, then its words.
    instruction = text.rsplit("\nLABEL ", 1)[1].replace("\\\n", " ")
    assert dict(re.findall(r"'([^']*)'='([^']*)'", instruction)) == labels
    assert ('org.envbuild.stage="image"' in instruction) == (dockerfile == OWN_LABEL)


@given(
    st.dictionaries(WRITABLE.filter(bool), WRITABLE, max_size=3),
    st.sampled_from(["'", "\n", "\r", "\t", "\x00", "\x1b", "\u2028", "\x85", "\xa0"]),
    st.booleans(),
)
def test_a_label_that_cannot_be_written_in_quotes_goes_through_the_api(
    tmp_path_factory: pytest.TempPathFactory, labels: dict[str, str], bad: str, in_name: bool
) -> None:
    path = tmp_path_factory.mktemp("context") / "Dockerfile"
    path.write_text(DOCKERFILE)
    name, value = ("org.example.bad" + bad, "v") if in_name else ("org.example.bad", f"a{bad}b")
    assert labelled_dockerfile(path, {**labels, name: value}) is None


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM scratch\nRUN true \\\n",  # the last line continues: the LABEL would join it
        "# escape=`\nFROM scratch\nRUN true `\n",
        "# Escape = `\nFROM scratch\n",
        "\udcff".encode("utf-8", "surrogateescape").decode("latin-1") + "\nFROM scratch\n",
    ],
)
def test_a_dockerfile_the_label_could_not_follow_as_written_is_left_alone(
    tmp_path: Path, dockerfile: str
) -> None:
    path = tmp_path / "Dockerfile"
    path.write_bytes(dockerfile.encode("latin-1"))
    assert labelled_dockerfile(path, {"org.example.a": "1"}) is None


def test_no_labels_or_no_dockerfile_is_none(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    assert labelled_dockerfile(path, {"org.example.a": "1"}) is None  # missing
    path.write_text(DOCKERFILE)
    assert labelled_dockerfile(path, {}) is None
    assert labelled_dockerfile(path, {"": "1"}) is None


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM scratch\nRUN true \\\n# a comment inside the RUN\nLABEL a=b\n",  # LABEL a=b is the RUN's
        "FROM scratch\nRUN true \\  \nLABEL a=b\n",  # spaces after the backslash: still continued
        "FROM scratch\nLABEL a=b\n# a comment after it\n",
        "FROM scratch\nLABEL a=b\nRUN true\n",
    ],
)
def test_labels_after_an_instruction_that_is_not_a_label_are_a_label_of_their_own(
    tmp_path: Path, dockerfile: str
) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    text = labelled_dockerfile(path, {"org.example.a": "1"})
    assert text == dockerfile.rstrip() + "\nLABEL 'org.example.a'='1'\n"
