"""Hostile matrix and knowledge files: each ends in a plan, or in one line per problem (exit 2).

The corpus (matrix_corpus.py) is generated from the shipped files. Most cases run in-process
(load, plan); a representative subset runs the real CLI in a subprocess under a memory limit and a
hang guard. Hypothesis then throws arbitrary text, bytes and structures at the loader.
"""

from __future__ import annotations

import datetime
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.core.errors import BadInput, MatrixError
from envbuild.core.models import Knowledge, Selection
from envbuild.core.yamlfile import path_label
from envbuild.knowledge.load import load_knowledge
from envbuild.plan.matrix import (
    default_matrix_path,
    knowledge_matrix,
    load_matrix,
    make_plan,
    require_entries,
)
from tests.conftest import REPO
from tests.hostile.matrix_corpus import KNOWLEDGE, KNOWLEDGE_CORPUS, MATRIX_CORPUS, Case, dump

MEMORY_LIMIT = 1536 * 1024 * 1024  # RLIMIT_AS of each CLI subprocess
HANG_GUARD_S = 120  # turns a hang into a failure; a case takes well under a second


# --- the oracles ----------------------------------------------------------------------------


def assert_one_line_problems(error: MatrixError | BadInput, label: str) -> None:
    problems = error.problems if isinstance(error, MatrixError) else [error.message]
    assert problems
    for problem in problems:
        assert "\n" not in problem, problem
        assert label in problem, (label, problem)
        assert len(problem) < 2000, problem[:200]


def plan_in_process(knowledge: Knowledge, path: Path) -> BadInput | None:
    """Load and plan as `envbuild plan -m PATH` does; the BadInput raised, or None."""
    try:
        matrix = load_matrix(path, knowledge)
        plan = make_plan(knowledge, matrix, Selection())
        require_entries(plan, matrix, Selection())
    except BadInput as exc:  # MatrixError and SelectionError are BadInput
        return exc
    return None


def check_outcome(case: Case, error: BadInput | None, label: str) -> None:
    if case.expect is not None or case.fails:
        assert error is not None, f"{case.id}: accepted a broken input"
    if error is not None:
        assert_one_line_problems(error, label)
        if case.expect is not None:
            assert case.expect in error.message, error.message


@pytest.mark.parametrize("case", MATRIX_CORPUS, ids=lambda c: c.id)
def test_hostile_matrix_ends_in_a_plan_or_one_line_per_problem(
    case: Case, knowledge: Knowledge, tmp_path: Path
) -> None:
    path = case.make(tmp_path)
    check_outcome(case, plan_in_process(knowledge, path), path_label(path))


@pytest.mark.parametrize("case", KNOWLEDGE_CORPUS, ids=lambda c: c.id)
def test_hostile_knowledge_file_is_refused_with_its_place(case: Case, tmp_path: Path) -> None:
    folder = tmp_path / "knowledge"
    folder.mkdir()
    path = case.make(folder)  # the hostile file; the others are the shipped ones
    for shipped in KNOWLEDGE.glob("*.yaml"):
        if shipped.name != path.name:
            (folder / shipped.name).symlink_to(shipped)
    error = None
    try:
        load_knowledge(folder)
    except MatrixError as exc:
        error = exc
    check_outcome(case, error, path.name)


def test_the_corpus_is_large_and_covers_each_kind() -> None:
    assert len(MATRIX_CORPUS) + len(KNOWLEDGE_CORPUS) >= 250
    assert len({c.id for c in MATRIX_CORPUS}) == len(MATRIX_CORPUS)
    assert len({c.id for c in KNOWLEDGE_CORPUS}) == len(KNOWLEDGE_CORPUS)
    assert sum(c.fails or c.expect is not None for c in MATRIX_CORPUS) > 200


# --- the real CLI, in subprocesses ----------------------------------------------------------

CLI_CASES = [
    "default:as-shipped",
    "default:axes=mapping",
    "default:description=mapping",
    "default:axes.cuda=null",
    "default:duplicate-top-axes",
    "default:duplicate-axes-cuda",
    "default:axes.framework:misspelt",
    "encoding-utf-16",
    "encoding-invalid-ff",
    "encoding-nul",
    "deep-flow-100000",
    "number-decimal-framework_version",
    "number-hex-cuda",
    "control-0007-raw",
    "control-001b-in-version",
    "tag-!!python/object/apply:os.system",
    "alias-billion-laughs",
    "alias-merge-bomb",
    "null-axis",
    "empty-framework-with-include",
    "trailing-newline-version",
    "include-version-of-another-framework",
    "axes-multiply-too-far",
    "size-over-the-limit",
    "special-fifo",
    "special-directory",
    "special-dev-zero",
    "special-symlink-loop",
    "special-sparse-8-gib",
    "special-proc-mem",
]


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@dataclass(frozen=True)
class CliRun:
    path: Path
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliRun]:
    """Every CLI case run at once: started one after another from this thread, then awaited."""
    by_id = {case.id: case for case in MATRIX_CORPUS}
    started = []
    for i, case_id in enumerate(CLI_CASES):
        folder = tmp_path_factory.mktemp(f"cli{i}")
        path = by_id[case_id].make(folder)
        out, err = (folder / "stdout").open("w+b"), (folder / "stderr").open("w+b")
        process = subprocess.Popen(
            [sys.executable, "-m", "envbuild", "plan", "-m", str(path)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=limit_memory,  # safe: no other thread runs in this process now
        )
        started.append((case_id, path, process, out, err))
    runs = {}
    for case_id, path, process, out, err in started:
        try:
            code = process.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = -1
        out.seek(0)
        err.seek(0)
        runs[case_id] = CliRun(
            path, code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )
        out.close()
        err.close()
    return runs


@pytest.mark.parametrize("case_id", CLI_CASES)
def test_the_cli_exits_0_or_2_with_one_line_per_problem(
    case_id: str, cli_runs: dict[str, CliRun]
) -> None:
    run = cli_runs[case_id]
    case = next(c for c in MATRIX_CORPUS if c.id == case_id)
    assert run.code != -1, f"{case_id}: still running after {HANG_GUARD_S} s"
    assert run.code in {0, 2}, (run.code, run.stderr[-2000:])
    assert "Traceback" not in run.stdout + run.stderr
    if case.fails or case.expect is not None:
        assert run.code == 2, run.stdout[-500:]
    if run.code == 2:
        lines = run.stderr.splitlines()
        assert lines
        for line in lines:
            assert line.startswith("envbuild: error:"), line
            assert path_label(run.path) in line, line
        if case.expect is not None:
            assert case.expect in run.stderr


def test_the_knowledge_base_gives_every_entry_selectors_of_its_own() -> None:
    # jax 0.9.0 and 0.9.0.1, tensorflow 2.15.0 and 2.15.0.post1: a release named exactly is
    # selected alone, so the whole knowledge base fans out into CI jobs.
    result = subprocess.run(
        [sys.executable, "-m", "envbuild", "ci-matrix"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"jax0.9.0-cpu-py3.11-bookworm"' in result.stdout
    assert '"jax0.9.0.1-cpu-py3.11-bookworm"' in result.stdout


# --- property-based -------------------------------------------------------------------------

PROPERTY = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=datetime.timedelta(seconds=10),  # a hang guard, not a timing assertion
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TOKENS = [
    "axes", "framework", "framework_version", "cuda", "python", "os", "include", "exclude",
    "defaults", "description", "repository", "torch", "jax", "tensorflow", "cpu", "'12.1'",
    "'3.11'", "bookworm", "latest", "'2.13.0'", "0.10", "3.10", "1e999", "0x1f", "~", "null",
    "true", "[", "]", "{", "}", ":", ": ", ",", "-", "- ", "\n", "\n  ", "  ", "&a ", "*a", "<<",
    "!!str ", "!!python/object ", "!x ", "'", '"', "#", "---", "...", "?", "|", ">", "%YAML 1.1",
    "\t", "\\", "\x07", "é", "\ufeff", "2024-13-45", "9" * 80,
]  # fmt: skip


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("property") / "m.yaml"


def outcome(knowledge: Knowledge, path: Path) -> None:
    error = plan_in_process(knowledge, path)  # any other exception fails the test
    if error is not None:
        assert_one_line_problems(error, path_label(path))


@PROPERTY
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map("".join))
def test_yaml_ish_text_ends_in_a_plan_or_bad_input(
    knowledge: Knowledge, scratch: Path, text: str
) -> None:
    scratch.write_bytes(text.encode("utf-8"))
    outcome(knowledge, scratch)


@PROPERTY
@given(st.binary(max_size=400))
def test_arbitrary_bytes_end_in_a_plan_or_bad_input(
    knowledge: Knowledge, scratch: Path, data: bytes
) -> None:
    scratch.write_bytes(data)
    outcome(knowledge, scratch)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
    | st.sampled_from(
        ["torch", "jax", "cpu", "12", "12.1", "3.11", "2.13.0", "0.10", "bookworm", "latest"]
    )
)
JSON_LIKE = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["framework", "cuda", "python", "x"]) | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=30,
)
MATRIX_LIKE = st.fixed_dictionaries(
    {
        "axes": st.dictionaries(
            st.sampled_from(["framework", "framework_version", "cuda", "python", "os"]), JSON_LIKE
        )
    },
    optional={
        "defaults": st.dictionaries(
            st.sampled_from(["python", "os", "repository", "cuda"]), JSON_LIKE
        ),
        "include": st.lists(JSON_LIKE, max_size=3),
        "exclude": JSON_LIKE,
        "description": JSON_LIKE,
    },
)


@PROPERTY
@given(JSON_LIKE | MATRIX_LIKE)
def test_json_like_documents_end_in_a_plan_or_bad_input(
    knowledge: Knowledge, scratch: Path, document: Any
) -> None:
    scratch.write_bytes(dump(document))
    outcome(knowledge, scratch)


# --- selectors ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def universe(knowledge: Knowledge) -> Any:
    defaults = load_matrix(default_matrix_path(), knowledge)
    return lambda selection: knowledge_matrix(knowledge, selection, defaults)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (Selection(framework_version="1" * 5000), "--framework-version '1111111111"),
        (Selection(python="3." + "1" * 5000), "(at most 64)"),
        (Selection(cuda="12\n"), "--cuda '12\\n' holds control characters"),
        (Selection(os="\x1b[31mbookworm"), "holds control characters"),
    ],
)
def test_a_selector_no_matrix_could_hold_is_one_clear_line(
    knowledge: Knowledge, selection: Selection, expected: str
) -> None:
    with pytest.raises(BadInput) as caught:
        make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), selection)
    assert expected in caught.value.message
    assert "\n" not in caught.value.message
    assert len(caught.value.message) < 300


def test_a_version_equal_to_a_release_selects_it_alone_a_prefix_selects_the_series(
    knowledge: Knowledge, universe: Any
) -> None:
    exact = Selection(framework="jax", framework_version="0.9.0", cuda="cpu")
    plan = make_plan(knowledge, universe(exact), exact)
    assert [e.framework_version for e in plan.entries] == ["0.9.0"]
    prefix = Selection(framework="jax", framework_version="0.9", cuda="cpu")
    versions = [e.framework_version for e in make_plan(knowledge, universe(prefix), prefix).entries]
    assert versions[:2] == ["0.9.0", "0.9.0.1"]
    assert all(v.startswith("0.9.") for v in versions)


@pytest.mark.parametrize(
    ("selection", "offered"),
    [
        (Selection(framework="nope"), "it offers framework: jax, tensorflow, torch"),
        (
            Selection(framework="torch", framework_version="0.10"),
            "framework_version of torch: 2.0.0,",
        ),
        (Selection(framework_version="5.5"), "jax 0.4.26 to "),
        (Selection(framework="jax", cuda="11"), "cuda of jax: cpu, 12, 13"),
        (Selection(os="trixie"), "it offers os: bookworm"),  # from matrices/default.yaml
    ],
)
def test_an_empty_selection_names_what_exists(
    knowledge: Knowledge, universe: Any, selection: Selection, offered: str
) -> None:
    if selection.os is None:
        matrix = universe(selection)
    else:
        matrix = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(knowledge, matrix, selection)
    with pytest.raises(BadInput) as caught:
        require_entries(plan, matrix, selection)
    assert offered in caught.value.message


SELECTOR_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=70) | st.sampled_from(
    [
        "torch",
        "2",
        "2.4",
        "2.4.1",
        "0.9.0",
        "latest",
        "cpu",
        "12",
        "12.1",
        "3.11",
        "bookworm",
        "9" * 5000,
    ]
)


@PROPERTY
@given(
    st.builds(
        Selection,
        framework=st.none() | SELECTOR_TEXT,
        framework_version=st.none() | SELECTOR_TEXT,
        cuda=st.none() | SELECTOR_TEXT,
        python=st.none() | SELECTOR_TEXT,
        os=st.none() | SELECTOR_TEXT,
    )
)
def test_arbitrary_selectors_end_in_a_plan_or_bad_input(
    knowledge: Knowledge, selection: Selection
) -> None:
    matrix = load_matrix(default_matrix_path(), knowledge)
    error = None
    try:
        require_entries(make_plan(knowledge, matrix, selection), matrix, selection)
    except BadInput as exc:  # any other exception fails the test
        error = exc
    if error is not None:
        assert "\n" not in error.message
        assert len(error.message) < 2000
