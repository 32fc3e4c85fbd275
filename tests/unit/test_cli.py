"""The command line without an engine: plan, render, and the exit codes of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.models import BuildOptions, Knowledge, Selection
from tests.support.lock_support import fresh_lock, the_entry


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("bytecode", [True, False, None])
def test_the_matrixs_bytecode_choice_reaches_every_entry(
    tmp_path: Path, bytecode: bool | None
) -> None:
    """`defaults.bytecode: false` plans every entry, the includes' too, without bytecode; true
    or no word plans them with it."""
    defaults = "" if bytecode is None else f"defaults: {{bytecode: {str(bytecode).lower()}}}\n"
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        defaults
        + "axes: {framework: [torch], cuda: [cpu]}\n"
        + "include:\n  - {framework: jax, framework_version: '0.10.2', cuda: cpu}\n"
    )
    code, out, err = run("plan", "-m", str(matrix), "--format", "json")
    assert code == 0, err
    entries = json.loads(out)["entries"]
    assert {e["framework"] for e in entries} == {"torch", "jax"}
    assert {e["bytecode"] for e in entries} == {bytecode is not False}


def test_plan_json_lists_only_releases_that_publish_cu121(knowledge: Knowledge) -> None:
    code, out, _ = run("plan", "--framework", "torch", "--cuda", "12.1", "--format", "json")
    assert code == 0
    document = json.loads(out)
    versions = {e["framework_version"] for e in document["entries"]}
    shipped = {
        r.version for r in knowledge.frameworks["torch"].releases if r.variant("12.1") is not None
    }
    assert versions == shipped
    assert versions
    assert {e["cuda"] for e in document["entries"]} == {"12.1"}
    first = document["entries"][0]
    assert set(first) == {
        "id",
        "framework",
        "framework_version",
        "cuda",
        "cudnn",
        "nccl",
        "python",
        "os",
        "platform",
        "base_image",
        "image",
        "packages",
        "user",
        "bytecode",
        "lock",
    }
    assert first["bytecode"] is True
    assert {e["user"] for e in document["entries"]} == {"envbuild"}
    assert all(x["reason"] for x in document["excluded"])
    assert {x["framework_version"] for x in document["excluded"]} == {
        r.version for r in knowledge.frameworks["torch"].releases
    } - shipped


def test_a_cuda_the_release_never_shipped_exits_2_naming_what_it_did() -> None:
    code, _, err = run(
        "plan", "--framework", "torch", "--framework-version", "2.6.0", "--cuda", "12.1"
    )
    assert code == 2
    assert "publishes no cu121 wheels; it ships cpu, cu118, cu124, cu126" in err
    assert "Traceback" not in err


def test_driver_drops_what_it_cannot_run() -> None:
    code, out, _ = run(
        "plan",
        "--framework",
        "torch",
        "--framework-version",
        "2.14.0",
        "--driver",
        "535.104.05",
        "--format",
        "json",
    )
    assert code == 0
    document = json.loads(out)
    assert {e["cuda"] for e in document["entries"]} == {"cpu", "12.6"}
    assert any("needs driver >= 580" in x["reason"] for x in document["excluded"])
    code, _, err = run("plan", "--driver", "latest")
    assert code == 2
    assert "--driver 'latest' is not a driver version" in err


def test_a_broken_matrix_exits_2_with_every_problem(tmp_path: Path) -> None:
    matrix = tmp_path / "broken.yaml"
    matrix.write_text("axes:\n  framework: [torch]\n  cuda: [cpu, twelve]\n  pyton: ['3.11']\n")
    code, _, err = run("plan", "-m", str(matrix))
    assert code == 2
    assert f"envbuild: error: {matrix}: axes.cuda[1]: 'twelve' is not a version" in err
    assert "axes.pyton: unknown key; did you mean 'python'?" in err
    assert "Traceback" not in err


def test_an_empty_selection_exits_2() -> None:
    code, _, err = run("plan", "--framework", "torch", "--python", "3.7")
    assert code == 2
    assert "publishes no wheels for Python 3.7" in err


def test_render_writes_contexts(tmp_path: Path, knowledge: Knowledge) -> None:
    for cuda in ("12.1", "12.4"):  # their locks, as `envbuild lock` leaves them
        chosen = Selection(framework="torch", framework_version="2.4.1", cuda=cuda)
        fresh_lock(the_entry(knowledge, chosen), BuildOptions(), knowledge)
    code, out, err = run(
        "render", "--framework-version", "2.4.1", "--cuda", "12", "-o", str(tmp_path)
    )
    assert code == 0, err
    written = sorted(p.parent.name for p in tmp_path.glob("*/Dockerfile"))
    assert written == ["torch2.4.1-cu121-py3.11-bookworm", "torch2.4.1-cu124-py3.11-bookworm"]
    assert "torch2.4.1-cu121-py3.11-bookworm" in out


def test_user_root_on_the_command_line_renders_an_image_that_runs_as_root(
    tmp_path: Path, knowledge: Knowledge
) -> None:
    chosen = Selection(framework="torch", framework_version="2.4.1", cuda="12.1")
    fresh_lock(the_entry(knowledge, chosen), BuildOptions(), knowledge)
    selectors = ("--framework-version", "2.4.1", "--cuda", "12.1")
    code, _, err = run("render", *selectors, "--user", "root", "-o", str(tmp_path / "root"))
    assert code == 0, err
    dockerfile = (tmp_path / "root" / "torch2.4.1-cu121-py3.11-bookworm" / "Dockerfile").read_text()
    assert "\nUSER 0:0\n" in dockerfile
    code, _, err = run("render", *selectors, "-o", str(tmp_path / "default"))
    assert code == 0, err
    dockerfile = (
        tmp_path / "default" / "torch2.4.1-cu121-py3.11-bookworm" / "Dockerfile"
    ).read_text()
    assert "\nUSER 1000:1000\n" in dockerfile
    code, out, err = run("plan", *selectors, "--user", "root", "--format", "json")
    assert code == 0, err
    assert {e["user"] for e in json.loads(out)["entries"]} == {"root"}
    for wrong in ("Root", "nobody", "0", ""):
        code, _, err = run("plan", *selectors, "--user", wrong)
        assert code == 2
        assert "--user" in err
        assert "'envbuild', 'root'" in err


def test_help_imports_neither_docker_nor_jinja() -> None:
    code = (
        "import sys\n"
        "from envbuild.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('docker', 'jinja2', 'yaml', 'requests') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "HEAVY="


def test_plan_frameworks_refuses_a_registry_it_cannot_ask_before_the_engine() -> None:
    selected = ("plan", "--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu")
    code, _, err = run(*selected, "--registry", "127.0.0.1:5000")
    assert code == 2
    assert "--registry says where plan looks for framework images; add --frameworks" in err
    code, _, err = run(*selected, "--frameworks", "--registry", "nohost")
    assert code == 2
    assert "--registry 'nohost' names no registry host" in err
    assert "Traceback" not in err


def test_plan_frameworks_without_an_engine_exits_3_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "plan", "--framework", "torch",
         "--framework-version", "2.13.0", "--cuda", "cpu", "--frameworks"],
        capture_output=True, text=True, check=False, timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
             "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("envbuild: error: ")
    assert "Traceback" not in done.stderr
