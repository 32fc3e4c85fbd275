"""Matrix files: validation with locations, expansion with reasons, selection."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.core.errors import MatrixError, SelectionError
from envbuild.core.models import Combination, Fleet, Knowledge, Plan, Selection
from envbuild.plan.matrix import (
    default_matrix_path,
    knowledge_matrix,
    load_matrix,
    make_plan,
    require_entries,
    selection_matches,
)
from envbuild.plan.matrix_file import Matrix


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_default_matrix_loads_and_expands(knowledge: Knowledge) -> None:
    matrix = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(knowledge, matrix, Selection())
    ids = {e.id for e in plan.entries}
    assert "torch2.13.0-cpu-py3.11-bookworm" in ids
    assert "torch2.4.1-cu121-py3.11-bookworm" in ids
    # 2.13.0 ships no cu128... the default matrix asks for 12.6 and 13.0, both shipped
    assert not plan.excluded


def test_every_problem_is_reported_at_once_with_its_place(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """
axes:
  framework: [torch, tensorfow]
  cuda: [cpu, "12.1", twelve]
  pyhton: ["3.11"]
  python: [3.10]
  os: [bookwrom]
exlude: []
""",
    )
    with pytest.raises(MatrixError) as caught:
        load_matrix(path, knowledge)
    problems = caught.value.problems
    assert f"{path}: axes.cuda[2]: 'twelve' is not a version (use 'cpu' or e.g. '12.1')" in problems
    assert any("axes.pyhton: unknown key; did you mean 'python'?" in p for p in problems)
    assert any("exlude: unknown key; did you mean 'exclude'?" in p for p in problems)
    assert any("axes.framework[1]: 'tensorfow' is not a known framework" in p for p in problems)
    assert any(
        "axes.python[0]: 3.1 was read as a YAML number; quote versions" in p for p in problems
    )
    assert any(
        "axes.os[0]: 'bookwrom' is not a known OS; did you mean 'bookworm'?" in p for p in problems
    )
    assert len(problems) == 6


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("axes: [", "not valid YAML"),
        ("- just a list", "expected a mapping with 'axes'"),
        ("defaults: {python: '3.11'}", "axes: missing"),
        ("axes: {cuda: [cpu]}", "axes.framework: missing"),
        (
            "axes: {framework: [torch], framework_version: ['9.9']}",
            "no known release matches '9.9'",
        ),
    ],
)
def test_broken_files_name_the_problem(
    knowledge: Knowledge, tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(MatrixError) as caught:
        load_matrix(write(tmp_path, text), knowledge)
    assert str(tmp_path / "x.yaml") in caught.value.message
    assert expected in caught.value.message


def test_missing_file(knowledge: Knowledge, tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="no such matrix file"):
        load_matrix(tmp_path / "nope.yaml", knowledge)


def test_expansion_keeps_every_exclusion_with_its_reason(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """
axes:
  framework: [torch]
  framework_version: ["2.4.1", "2.6"]
  cuda: [cpu, "12.1", "12.4"]
  python: ["3.11", "3.13"]
exclude:
  - {cuda: cpu, python: "3.13"}
include:
  - {framework_version: "2.13.0", cuda: "13.0", python: "3.12"}
""",
    )
    plan = make_plan(knowledge, load_matrix(path, knowledge), Selection())
    ids = {e.id for e in plan.entries}
    assert ids == {
        "torch2.4.1-cpu-py3.11-bookworm",
        "torch2.4.1-cu121-py3.11-bookworm",
        "torch2.4.1-cu124-py3.11-bookworm",
        "torch2.6.0-cpu-py3.11-bookworm",
        "torch2.6.0-cu124-py3.11-bookworm",
        "torch2.6.0-cu124-py3.13-bookworm",
        "torch2.13.0-cu130-py3.12-bookworm",
    }
    reasons = {
        (x.combination.framework_version, x.combination.cuda, x.combination.python): x.reason
        for x in plan.excluded
    }
    assert reasons[("2.6.0", "12.1", "3.11")] == (
        "torch 2.6.0 publishes no cu121 wheels; it ships cpu, cu118, cu124, cu126"
    )
    assert reasons[("2.4.1", "12.4", "3.13")].startswith(
        "torch 2.4.1 publishes no wheels for Python 3.13"
    )
    assert reasons[("2.4.1", "cpu", "3.13")] == f"excluded by {path}: exclude[0]"
    assert len(plan.entries) + len(plan.excluded) == 2 * 3 * 2 + 1


def test_pypi_variant_installs_from_pypi_others_from_the_framework_index(
    knowledge: Knowledge,
) -> None:
    matrix = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(knowledge, matrix, Selection(framework_version="2.4.1"))
    (entry,) = plan.entries
    assert entry.install.requirement == "torch==2.4.1"
    assert entry.install.index_url is None
    cpu = make_plan(knowledge, matrix, Selection(framework_version="2.13.0", cuda="cpu")).entries[0]
    assert cpu.install.requirement == "torch==2.13.0+cpu"
    assert cpu.install.index_url == "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(
    ("selection", "matches"),
    [
        (Selection(framework_version="2.1"), True),
        (Selection(framework_version="2.10"), False),
        (Selection(cuda="12"), True),
        (Selection(cuda="12.1"), True),
        (Selection(cuda="12.4"), False),
        (Selection(cuda="cpu"), False),
        (Selection(python="3.11", os="bookworm", framework="torch"), True),
        (Selection(os="trixie"), False),
    ],
)
def test_selectors(selection: Selection, matches: bool) -> None:
    combo = Combination(
        framework="torch", framework_version="2.1.2", cuda="12.1", python="3.11", os="bookworm"
    )
    assert selection_matches(selection, combo) is matches


def test_knowledge_universe_and_driver_filter(knowledge: Knowledge) -> None:
    defaults = load_matrix(default_matrix_path(), knowledge)
    selection = Selection(framework="torch", framework_version="2.13.0")
    universe = knowledge_matrix(knowledge, selection, defaults)
    plan = make_plan(knowledge, universe, selection, fleet=Fleet(driver="535.104.05"))
    assert {e.cuda for e in plan.entries} == {"cpu", "12.6", "12.9"}
    reasons = {x.combination.cuda: x.reason for x in plan.excluded}
    assert reasons["13.0"] == (
        "CUDA 13.0 needs driver >= 580.65.06 (CUDA 13.x minor-version compatibility); "
        "driver 535.104.05 is older"
    )


def test_an_empty_selection_says_why_and_what_ships(knowledge: Knowledge) -> None:
    defaults = load_matrix(default_matrix_path(), knowledge)
    selection = Selection(framework="torch", framework_version="2.6.0", cuda="12.1")
    universe = knowledge_matrix(knowledge, selection, defaults)
    plan = make_plan(knowledge, universe, selection)
    with pytest.raises(SelectionError) as caught:
        require_entries(plan, universe, selection)
    assert caught.value.exit_code == 2
    assert (
        "torch 2.6.0 publishes no cu121 wheels; it ships cpu, cu118, cu124, cu126"
        in caught.value.message
    )


def test_newest_only_picks_the_newest_release_that_fits(knowledge: Knowledge) -> None:
    defaults = load_matrix(default_matrix_path(), knowledge)
    selection = Selection(framework="torch", cuda="12.1")
    plan = make_plan(
        knowledge, knowledge_matrix(knowledge, selection, defaults), selection, newest_only=True
    )
    assert [e.id for e in plan.entries] == ["torch2.5.1-cu121-py3.11-bookworm"]


def _build_plan(path: Path) -> tuple[Matrix, Plan]:
    """The plan `envbuild build -m PATH` builds (newest_only, as the build command asks)."""
    from envbuild.cli.options import plan_from

    kwargs: dict[str, Any] = {
        "framework": None, "framework_version": None, "cuda": None, "python": None,
        "os_name": None, "matrix_file": path, "repository": None,
    }  # fmt: skip
    _, matrix, plan = plan_from(kwargs, newest_only=True)
    return matrix, plan


def _generated_matrices(knowledge: Knowledge, count: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Matrices of includes alone, and includes crossed with axes of one or more frameworks,
    each include picking a framework (or not), a release or prefix of any framework, a CUDA."""
    rng = random.Random(27)
    releases = {f: [r.version for r in info.releases] for f, info in knowledge.frameworks.items()}
    frameworks = sorted(releases)
    for n in range(count):
        includes = []
        axes: dict[str, Any] | None = None
        if n % 2:
            axes = {"framework": rng.sample(frameworks, rng.randint(1, 3)), "cuda": ["cpu"]}
            if rng.random() < 0.5:
                axes["framework_version"] = [rng.choice(releases[axes["framework"][0]])]
        for _ in range(rng.randint(1, 4)):
            framework = rng.choice(frameworks)
            point: dict[str, Any] = {"cuda": rng.choice(["cpu", "12.1", "12"])}
            if axes is None or rng.random() < 0.6:
                point["framework"] = framework
            if rng.random() < 0.8:  # sometimes another framework's release: an error, never lost
                owner = framework if rng.random() < 0.8 else rng.choice(frameworks)
                version = rng.choice(releases[owner])
                point["framework_version"] = version if rng.random() < 0.7 else version[:3]
            if rng.random() < 0.3:
                point["packages"] = ["numpy"]
            includes.append(point)
        document: dict[str, Any] = {"defaults": {"packages": ["numpy"]}, "include": includes}
        if axes is not None:
            document["axes"] = axes
        yield f"m{n}", document


def test_every_include_is_built_excluded_with_a_reason_or_refused(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    # Nothing a user wrote may silently disappear (issue 27): not a matrix of includes alone
    # (GitHub Actions allows one), not an include crossed with axes, not under build's
    # newest-only selection, which applies to the knowledge base's matrix only.
    import yaml

    refusals: list[str] = []
    kept = 0
    for name, document in _generated_matrices(knowledge, 300):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        try:
            matrix, plan = _build_plan(path)
        except (MatrixError, SelectionError) as exc:
            # refused with its place, or nothing left to build: every exclusion says why
            refusals.append(exc.message)
            continue
        planned = [e.combination() for e in plan.entries] + [x.combination for x in plan.excluded]
        first = matrix.axes["framework"][:1]
        for point in document["include"]:
            framework = point.get("framework") or first[0]
            wanted = point.get("framework_version")
            found = [
                c for c in planned
                if c.framework == framework and c.cuda == point["cuda"]
                and (wanted is None or c.framework_version.split(".")[: len(wanted.split("."))] == wanted.split("."))
            ]  # fmt: skip
            assert found, f"{name}: include {point} is neither planned nor excluded: {document}"
            kept += 1
    assert kept  # the corpus reaches both ends
    assert refusals
    said = ("include[", "publishes no", "no entry to build")
    assert [m for m in refusals if not any(w in m for w in said)] == []


def test_a_matrix_with_neither_axes_nor_includes_names_both_fixes(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    for text in ("description: nothing\n", "include: []\n", "defaults: {python: '3.11'}\n"):
        with pytest.raises(MatrixError, match=r"axes: missing; give axes .* or a list of include"):
            load_matrix(write(tmp_path, text), knowledge)
    with pytest.raises(MatrixError, match=r"include\[0\]\.framework: missing; with no axes"):
        load_matrix(write(tmp_path, "include: [{cuda: cpu}]\n"), knowledge)


def test_images_run_as_envbuild_unless_the_matrix_or_an_include_says_root(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    def users(defaults: str = "", include: str = "", **kwargs: Any) -> dict[str, str]:
        text = (
            f"defaults: {{python: '3.12'{defaults}}}\n"
            "axes:\n  framework: [torch, jax]\n  cuda: [cpu]\n"
            + (f"include:\n{include}" if include else "")
        )
        matrix = load_matrix(write(tmp_path, text), knowledge)
        plan = make_plan(knowledge, matrix, Selection(), newest_only=True, **kwargs)
        return {e.framework: e.user for e in plan.entries}

    assert users() == {"torch": "envbuild", "jax": "envbuild"}
    assert users(", user: root") == {"torch": "root", "jax": "root"}
    jax_root = "  - {framework: jax, cuda: cpu, user: root}\n"
    assert users(include=jax_root) == {"torch": "envbuild", "jax": "root"}
    assert users(include=jax_root * 2) == {"torch": "envbuild", "jax": "root"}
    torch_back = "  - {framework: torch, cuda: cpu, user: envbuild}\n"
    assert users(", user: root", torch_back) == {"torch": "envbuild", "jax": "root"}
    # The command line's --user wins over the matrix.
    assert users(include=jax_root, user="envbuild") == {"torch": "envbuild", "jax": "envbuild"}
    assert users(user="root") == {"torch": "root", "jax": "root"}


def test_two_includes_of_one_entry_that_disagree_on_its_user_are_refused(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    text = (
        "include:\n  - {framework: jax, cuda: cpu, user: root}\n"
        "  - {framework: jax, cuda: cpu, packages: [optax], user: envbuild}\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as caught:
        make_plan(knowledge, load_matrix(path, knowledge), Selection())
    assert caught.value.problems == [
        f"{path}: include[1].user: 'envbuild', but include[0] of the same entry says 'root'; "
        "give that entry one user"
    ]
