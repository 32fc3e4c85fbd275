"""The lock's framework part (lockfile.framework_part): the framework its header names and what
that pulls in by the lock's `# via` annotations, installed in layers below the team's packages;
and its CUDA libraries' part (lockfile.cuda_part), installed lowest of all."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuild.lock.lockfile import CUDA_PART_HEADER, cuda_part, framework_part, pins
from envbuild.payload.install_env import InstallError, lock_part


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


def test_the_cuda_part_is_the_same_file_for_every_lock_pinning_the_same_cuda_libraries() -> None:
    """Its pins and hash lines alone: no annotation (what pulls a library in differs between
    releases) and no line of the lock's header (the framework's version is in it)."""
    cuda = [
        block("nvidia-cublas-cu12==12.1.3.1", "torch"),
        block("nvidia-nccl-cu12==2.20.5", "torch"),
    ]
    older = HEADER + cuda[0] + block("torch==2.4.1") + cuda[1] + block("triton==3.0.0", "torch")
    newer = (
        HEADER.replace("2.4.1", "2.4.0") + block("numpy==2.0.0") + cuda[0].replace("torch", "x")
        + cuda[1] + block("torch==2.4.0")
    )  # fmt: skip
    part = cuda_part(older, "nvidia-*")
    assert part == cuda_part(newer, "nvidia-*")
    assert part.startswith(CUDA_PART_HEADER)
    assert pins(part) == {"nvidia-cublas-cu12": "12.1.3.1", "nvidia-nccl-cu12": "2.20.5"}
    assert "# via" not in part
    assert "input" not in part
    assert cuda_part(HEADER + block("torch==2.13.0+cpu") + block("six==1.17.0"), "nvidia-*") == ""


pin_names = st.sampled_from(["nvidia-cublas-cu12", "nvidia_cudnn_cu12", "Nvidia.NCCL-cu12", "torch",
                             "six", "nvidia", "xnvidia-a"])  # fmt: skip


@given(
    blocks=st.lists(
        st.tuples(pin_names, st.integers(0, 3), st.lists(names, max_size=2), st.booleans()),
        max_size=8,
    )
)
def test_the_installer_takes_the_same_pins_from_the_cuda_part_as_from_the_lock(
    blocks: list[tuple[str, int, list[str], bool]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The image's first install (`install_env.py --only 'nvidia-*'` on cuda.lock) installs
    exactly the CUDA libraries the lock pins, each with every hash line the lock gives it, a
    last line without a newline included."""
    text = HEADER
    for name, hashes, parents, newline in blocks:
        lines = [f"{name}==1.0"] + [f"    --hash=sha256:{h}{'0' * 63}" for h in range(hashes)]
        text += " \\\n".join(lines) + "\n" + "".join(f"    # via {p}\n" for p in parents)
        if not newline:
            text = text.rstrip("\n")
            break
    folder = tmp_path_factory.mktemp("locks")
    (folder / "lock").write_text(text)
    part = cuda_part(text, "nvidia-*")
    (folder / "cuda").write_text(part)
    taken = {}
    for name in ("lock", "cuda"):
        try:
            taken[name] = Path(lock_part(str(folder / name), "nvidia-*", str(folder))).read_text()
        except InstallError:  # pins nothing of that name: the same refusal from both
            taken[name] = "InstallError"
    assert taken["cuda"] == taken["lock"].rstrip("\n") + ("\n" if part else "") or (
        not part and taken["lock"] == "InstallError"
    )
