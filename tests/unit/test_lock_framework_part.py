"""The lock's framework part (lockfile.framework_part): the framework its header names and what
that pulls in by the lock's `# via` annotations, installed in layers below the team's packages."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from envbuild.lock.lockfile import framework_part, pins


def block(pin: str, *parents: str) -> str:
    digest = hashlib.sha256(pin.encode()).hexdigest()
    text = f"{pin} \\\n    --hash=sha256:{digest}\n"
    if len(parents) == 1:
        return text + f"    # via {parents[0]}\n"
    if parents:
        return text + "    # via\n" + "".join(f"    #   {p}\n" for p in parents)
    return text


HEADER = (
    '# envbuild 0.1.0 lock of x\n# input framework: "torch==2.4.1"\n# input packages: ["six"]\n'
)


def test_the_framework_and_what_it_pulls_in_with_their_hash_lines_in_the_locks_order() -> None:
    text = HEADER + "".join((
        block("filelock==3.0.0", "torch", "triton"),
        block("markupsafe==3.0.0", "jinja2"),
        block("jinja2==3.1.6", "torch"),
        block("numpy==2.0.0"),
        block("six==1.17.0"),
        block("requests==2.0.0", "transformers"),
        block("torch==2.4.1"),
        block("transformers==4.0.0"),
        block("triton==3.0.0", "torch"),
        block("typing-extensions==4.0.0", "torch", "transformers"),
    ))  # fmt: skip
    part = framework_part(text)
    assert pins(part) == {
        "filelock": "3.0.0", "markupsafe": "3.0.0", "jinja2": "3.1.6", "torch": "2.4.1",
        "triton": "3.0.0", "typing-extensions": "4.0.0",
    }  # fmt: skip
    assert list(pins(part)) == [
        "filelock",
        "markupsafe",
        "jinja2",
        "torch",
        "triton",
        "typing-extensions",
    ]
    # Whole blocks: each pin keeps its hashes and annotations.
    assert block("filelock==3.0.0", "torch", "triton") in part
    assert block("typing-extensions==4.0.0", "torch", "transformers") in part
    assert "# input" not in part


def test_nothing_to_split_off_gives_no_part() -> None:
    annotated = block("filelock==3.0.0", "torch") + block("torch==2.4.1") + block("six==1.17.0")
    assert framework_part(annotated) == ""  # no framework named in a header
    assert framework_part(HEADER + block("torch==2.4.1") + block("six==1.17.0")) == ""  # no via
    only = HEADER + block("filelock==3.0.0", "torch") + block("torch==2.4.1")
    assert framework_part(only) == only.removeprefix(HEADER)  # every pin is the framework's
    elsewhere = '# input framework: "tensorflow==2.20.0"\n' + annotated
    assert framework_part(elsewhere) == ""  # the framework is not pinned
    assert framework_part('# input framework: "not a requirement!"\n' + annotated) == ""
    assert framework_part("# input framework: [1, 2]\n" + annotated) == ""


def test_an_extra_on_the_framework_and_a_names_spelling_do_not_matter() -> None:
    text = (
        '# input framework: "JAX[cuda12]==0.4.30"\n'
        + block("jax==0.4.30")
        + block("jaxlib==0.4.30", "jax")
        + block("jax-cuda12-plugin==0.4.30", "jax")
        + block("ML_Dtypes==0.5.0", "jax", "jaxlib")
        + block("six==1.17.0")
    )
    assert set(pins(framework_part(text))) == {"jax", "jaxlib", "jax-cuda12-plugin", "ml-dtypes"}


names = st.sampled_from(["a", "b", "c", "d", "e", "torch"])


@given(st.dictionaries(names, st.lists(names, max_size=3), min_size=1))
def test_the_part_is_closed_under_via_and_holds_the_framework(graph: dict[str, list[str]]) -> None:
    graph.setdefault("torch", [])
    text = HEADER + "".join(block(f"{n}==1.0", *sorted(set(p))) for n, p in sorted(graph.items()))
    part = set(pins(framework_part(text)))
    if not part:
        return
    assert "torch" in part
    for child, parents in graph.items():
        if set(parents) & part:  # closed: what a member pulls in is a member
            assert child in part
        if child in part and child != "torch":  # and nothing else: each was pulled in
            assert set(parents) & part
