"""The team's packages: matrix `packages` / `requirements` / `numpy`, `-p` and `-r`, each bad
value one line naming its place (exit 2); entries carry them normalized, ids unchanged."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.errors import BadInput, MatrixError
from envbuild.core.models import Knowledge, Selection
from envbuild.plan.matrix import load_matrix, make_plan
from envbuild.plan.packages import MAX_PACKAGES, MAX_REQUIREMENTS_BYTES

BASE = {
    "axes": {"framework": ["torch"], "framework_version": ["2.4.1"], "cuda": ["12.1"]},
    "include": [{"framework": "jax", "framework_version": "0.10", "cuda": "cpu"}],
}


def write_matrix(tmp_path: Path, **changes: object) -> Path:
    document = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if key == "include_packages":
            document["include"][0]["packages"] = value
        else:
            document.setdefault("defaults", {})[key] = value
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def entries(
    knowledge: Knowledge, path: Path, extra: tuple[str, ...] = ()
) -> dict[str, tuple[str, ...]]:
    plan = make_plan(knowledge, load_matrix(path, knowledge), Selection(), packages=extra)
    return {e.id: e.packages for e in plan.entries}


def test_defaults_and_include_packages_reach_their_entries_normalized(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    (tmp_path / "req").mkdir()
    (tmp_path / "req" / "train.txt").write_text(
        "# team\nTransformers >= 4.40  # hub\n\nscipy\n", encoding="utf-8"
    )
    path = write_matrix(
        tmp_path,
        packages=["Pillow", "pillow", "requests[socks]"],
        requirements="req/train.txt",
        include_packages=["optax"],
    )
    found = entries(knowledge, path)
    torch = found["torch2.4.1-cu121-py3.11-bookworm"]
    jax = found["jax0.10.2-cpu-py3.11-bookworm"]
    assert torch == ("numpy", "pillow", "requests[socks]", "scipy", "transformers>=4.40")
    assert jax == tuple(sorted({*torch, "optax"}))


def test_numpy_false_leaves_it_out_and_a_named_numpy_is_not_doubled(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    assert set(entries(knowledge, write_matrix(tmp_path, numpy=False)).values()) == {()}
    pinned = entries(knowledge, write_matrix(tmp_path, packages=["NumPy<2"]))
    assert set(pinned.values()) == {("numpy<2",)}


def test_packages_change_neither_ids_nor_tags(knowledge: Knowledge, tmp_path: Path) -> None:
    plain = make_plan(knowledge, load_matrix(write_matrix(tmp_path), knowledge), Selection())
    more = make_plan(
        knowledge,
        load_matrix(write_matrix(tmp_path, packages=["scipy"]), knowledge),
        Selection(),
        packages=("rich",),
    )
    assert [(e.id, e.image) for e in plain.entries] == [(e.id, e.image) for e in more.entries]
    assert all("rich" in e.packages and "scipy" in e.packages for e in more.entries)


def _fifo(directory: Path) -> str:
    os.mkfifo(directory / "fifo.txt")
    return "fifo.txt"


def _loop(directory: Path) -> str:
    (directory / "a.txt").symlink_to("b.txt")
    (directory / "b.txt").symlink_to("a.txt")
    return "a.txt"


def _file(content: bytes) -> Callable[[Path], str]:
    def make(directory: Path) -> str:
        (directory / "r.txt").write_bytes(content)
        return "r.txt"

    return make


REQUIREMENTS_FILES: dict[str, tuple[Callable[[Path], str], str]] = {
    "fifo": (_fifo, "not a regular file"),
    "link-loop": (_loop, "loop of links"),
    "missing": (lambda d: "absent.txt", "no such file"),
    "folder": (lambda d: ".", "not a regular file"),
    "binary": (_file(bytes(range(256)) * 4), "not UTF-8"),
    "huge": (_file(b"numpy\n" * (MAX_REQUIREMENTS_BYTES // 6 + 1)), "larger than"),
    "too-many": (_file(b"".join(b"p%d\n" % i for i in range(MAX_PACKAGES + 1))), "more than"),
    **{
        f"option-{name}": (_file(b"numpy\n" + line + b"\n"), ":2'")
        for name, line in {
            "e": b"-e .",
            "index-url": b"--index-url https://evil.example/simple",
            "nested": b"-r other.txt",
            "constraint": b"-c c.txt",
            "continuation": b"numpy \\",
        }.items()
    },
    "framework": (_file(b"torch==2.5.0\n"), "the entry fixes the framework"),
    "companion": (_file(b"pytorch\n"), "the entry fixes the framework"),
    "bad-pep508": (_file(b"numpy>=>2\n"), "not a PEP 508 requirement"),
    "url": (_file(b"pkg @ https://example.com/pkg.whl\n"), "direct URL"),
    "control": (_file(b"num\x1bpy\n"), "control characters"),
}


@pytest.mark.parametrize("case", sorted(REQUIREMENTS_FILES), ids=str)
def test_bad_requirements_files_are_one_line_naming_the_file(
    case: str, knowledge: Knowledge, tmp_path: Path
) -> None:
    make, expected = REQUIREMENTS_FILES[case]
    name = make(tmp_path)
    with pytest.raises(MatrixError) as matrix_error:
        load_matrix(write_matrix(tmp_path, requirements=name), knowledge)
    (line,) = matrix_error.value.problems
    assert "defaults.requirements" in line
    assert expected in line
    runner = CliRunner()
    result = runner.invoke(main, ["plan", "--framework", "torch", "-r", str(tmp_path / name)])
    assert result.exit_code == 2
    (cli_line,) = result.stderr.strip().splitlines()
    assert cli_line.startswith("envbuild: error: -r/--requirements")
    assert expected in cli_line


HOSTILE_VALUES: dict[str, tuple[object, str]] = {
    "not-a-list": ("numpy", "expected a list"),
    "mapping": ({"numpy": 1}, "expected a list"),
    "number": ([1.5], "expected a string"),
    "null-item": ([None], "expected a string"),
    "nested": ([["numpy"]], "expected a string"),
    "huge-list": (["numpy"] * (MAX_PACKAGES + 1), f"more than {MAX_PACKAGES}"),
    "huge-item": (["a" * 10_000], "characters long"),
    "empty": ([""], "empty"),
    "option": (["--index-url=https://x"], "is an option"),
    "bad-pep508": (["numpy>=>1"], "not a PEP 508"),
    "torch": (["torch>=2.6"], "fixes the framework"),
    "torch-spelled": (["Torch"], "fixes the framework"),
    "tensorflow-cpu": (["tensorflow-cpu"], "fixes the framework"),
    "url": (["x @ file:///etc/passwd"], "direct URL"),
    "newline": (["numpy\nscipy"], "control characters"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_VALUES), ids=str)
def test_hostile_package_values_are_one_line_naming_the_key(
    case: str, knowledge: Knowledge, tmp_path: Path
) -> None:
    value, expected = HOSTILE_VALUES[case]
    if case == "tensorflow-cpu":  # a package of a framework this matrix builds
        document = {"axes": {"framework": ["tensorflow"]}, "defaults": {"packages": value}}
        path = tmp_path / "tf.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
    else:
        path = write_matrix(tmp_path, packages=value)
    with pytest.raises(MatrixError) as error:
        load_matrix(path, knowledge)
    assert error.value.exit_code == 2
    assert all("defaults.packages" in p for p in error.value.problems)
    assert expected in error.value.problems[0]
    assert all("\n" not in p for p in error.value.problems)


def test_numpy_must_be_a_boolean(knowledge: Knowledge, tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match=r"defaults\.numpy: expected true or false"):
        load_matrix(write_matrix(tmp_path, numpy="no"), knowledge)


def test_include_packages_name_their_include(knowledge: Knowledge, tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match=r"include\[0\]\.packages\[0\].*jax.*fixes the framework"):
        load_matrix(write_matrix(tmp_path, include_packages=["jax==0.4.30"]), knowledge)


def test_exclude_points_take_no_packages(knowledge: Knowledge, tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    document = {**BASE, "exclude": [{"cuda": "12.1", "packages": ["numpy"]}]}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    with pytest.raises(MatrixError, match=r"exclude\[0\]\.packages: unknown key"):
        load_matrix(path, knowledge)


def test_cli_packages_show_in_plan_json() -> None:
    result = CliRunner().invoke(
        main,
        ["plan", "--framework", "torch", "--framework-version", "2.4.1", "--cuda", "12.1",
         "-p", "Transformers>=4.40", "-p", "numpy==2.1.0", "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    (entry,) = json.loads(result.stdout)["entries"]
    assert entry["packages"] == ["numpy==2.1.0", "transformers>=4.40"]
    assert entry["id"] == "torch2.4.1-cu121-py3.11-bookworm"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("torch==2.5", "fixes the framework"), ("x" * 5000, "characters long"), ("-e .", "option")],
)
def test_a_bad_package_option_is_one_line(value: str, expected: str) -> None:
    result = CliRunner().invoke(main, ["plan", "--framework", "torch", "-p", value])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("envbuild: error: -p/--package")
    assert expected in line


def test_check_packages_rejects_more_than_the_bound() -> None:
    from envbuild.plan.packages import check_packages

    with pytest.raises(BadInput, match="more than"):
        check_packages([f"p{i}" for i in range(MAX_PACKAGES + 1)], "-p/--package", {})
