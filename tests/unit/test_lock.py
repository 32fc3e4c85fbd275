"""Locks: header and freshness, pins kept unless --upgrade, unresolvable entries, --locked,
--check, and credentials kept out of every lock and every line printed.

Real uv runs here, offline, against a folder of tiny wheels the tests make (a stand-in torch
2.4.1 among them); nothing reads the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from envbuild.cli.lock import locks_for
from envbuild.cli.main import main
from envbuild.core.errors import BadInput
from envbuild.core.models import BuildOptions, Entry, Install, Knowledge, Plan, Selection
from envbuild.core.redact import forget_all
from envbuild.lock.lockfile import (
    header,
    inputs_digest,
    lock_for,
    lock_inputs,
    lock_path,
    lock_state,
    pins,
    update_lock,
)
from envbuild.lock.planning import plan_with_locks
from envbuild.lock.uv import one_line_reason
from envbuild.plan.matrix import load_matrix, make_plan
from tests.support.lock_support import make_wheel

SECRET = "Sup3rSecretPw"
MATRIX = {
    "axes": {"framework": ["torch"], "framework_version": ["2.4.1"], "cuda": ["12.1"]},
    "defaults": {"packages": ["tinyb"]},
}


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "torch", "2.4.1")
    make_wheel(folder, "numpy", "2.0.0")
    make_wheel(folder, "tinyb", "1.0")
    make_wheel(folder, "needs_new_torch", "1.0", ("torch>=2.6",))
    return folder


@pytest.fixture
def matrix_path(tmp_path: Path) -> Path:
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(MATRIX), encoding="utf-8")
    return path


@pytest.fixture
def entry(knowledge: Knowledge, matrix_path: Path) -> Entry:
    (found,) = make_plan(knowledge, load_matrix(matrix_path, knowledge), Selection()).entries
    assert found.install.requirement == "torch==2.4.1"
    return found


def offline(wheelhouse: Path, **changes: object) -> BuildOptions:
    return dataclasses.replace(BuildOptions(wheelhouse=wheelhouse, offline=True), **changes)  # type: ignore[arg-type]


def test_an_offline_lock_pins_every_package_with_hashes(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    update = update_lock(entry, offline(wheelhouse), knowledge, matrix_path=matrix_path)
    assert update.path == matrix_path.parent / "team.lock" / f"{entry.id}.txt"
    text = update.path.read_text(encoding="utf-8")
    assert pins(text) == {"numpy": "2.0.0", "tinyb": "1.0", "torch": "2.4.1"}
    assert text.count("--hash=sha256:") == 3
    lines = text.splitlines()
    assert lines[0].startswith("# envbuild ")
    assert entry.id in lines[0]
    assert "torch==2.4.1 with numpy, tinyb for CPython 3.11 on x86_64-manylinux_2_36" in lines[1]
    assert f"# inputs: {inputs_digest(lock_inputs(entry, offline(wheelhouse), knowledge))}" in lines
    assert update.changes == ("+ numpy 2.0.0", "+ tinyb 1.0", "+ torch 2.4.1")
    assert lock_state(entry, offline(wheelhouse), matrix_path, knowledge) == "fresh"
    lock = lock_for(
        entry, offline(wheelhouse), matrix_path=matrix_path, locked=True, knowledge=knowledge
    )
    assert lock.text == text
    assert lock.path == update.path


def test_old_pins_are_kept_and_a_new_wheel_leaves_the_lock_fresh_until_upgrade(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    options = offline(wheelhouse)
    update_lock(entry, options, knowledge, matrix_path=matrix_path)
    make_wheel(wheelhouse, "numpy", "2.1.0")
    assert lock_state(entry, options, matrix_path, knowledge) == "fresh"
    again = update_lock(entry, options, knowledge, matrix_path=matrix_path)
    assert not again.changed
    assert pins(again.text)["numpy"] == "2.0.0"
    newer = update_lock(entry, options, knowledge, matrix_path=matrix_path, upgrade=True)
    assert newer.changed
    assert newer.changes == ("numpy 2.0.0 → 2.1.0",)


def _variants(entry: Entry, options: BuildOptions) -> dict[str, tuple[Entry, BuildOptions]]:
    replace = dataclasses.replace
    return {
        "packages": (replace(entry, packages=(*entry.packages, "rich")), options),
        "python": (replace(entry, python="3.12"), options),
        "os-glibc": (replace(entry, os="trixie"), options),
        "framework": (replace(entry, install=Install(requirement="torch==2.5.1", index_url=None)), options),
        "framework-index": (
            replace(entry, install=Install(requirement="torch==2.4.1", index_url="https://i.example/whl")),
            options,
        ),
        "index-url": (entry, replace(options, index_url="https://mirror.example/simple")),
        "extra-index": (entry, replace(options, extra_index_urls=("https://x.example/simple",))),
        "framework-mirror": (entry, replace(options, framework_index="https://m.example/whl/cpu")),
        "online": (entry, replace(options, offline=False)),
        "no-wheelhouse": (entry, replace(options, wheelhouse=None, offline=False)),
    }  # fmt: skip


CHANGES = ["packages", "python", "os-glibc", "framework", "framework-index", "index-url",
           "extra-index", "framework-mirror", "online", "no-wheelhouse"]  # fmt: skip


def test_the_lock_records_the_framework_index_given_without_its_credentials(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path
) -> None:
    own = dataclasses.replace(
        entry, install=Install(requirement="torch==2.13.0+cpu", index_url="https://i.example/cpu")
    )
    mirror = f"https://bot:{SECRET}@mirror.example/whl/cpu"
    assert lock_inputs(own, offline(wheelhouse), knowledge)["framework_index"] == (
        "https://i.example/cpu"
    )
    inputs = lock_inputs(own, offline(wheelhouse, framework_index=mirror), knowledge)
    assert inputs["framework_index"] == "https://mirror.example/whl/cpu"
    assert SECRET not in json.dumps(inputs)
    none = lock_inputs(own, offline(wheelhouse, framework_index="none"), knowledge)
    assert none["framework_index"] == "none"


@pytest.mark.parametrize("change", CHANGES)
def test_each_input_change_makes_the_lock_stale(
    change: str, entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    options = offline(wheelhouse)
    inputs = lock_inputs(entry, options, knowledge)
    digest = inputs_digest(inputs)
    path = lock_path(entry, matrix_path, digest)
    path.parent.mkdir()
    path.write_text(header(entry, inputs, digest) + "numpy==2.0.0\n", encoding="utf-8")
    assert lock_state(entry, options, matrix_path, knowledge) == "fresh"
    changed_entry, changed_options = _variants(entry, options)[change]
    assert lock_state(changed_entry, changed_options, matrix_path, knowledge) == "stale"
    with pytest.raises(BadInput) as error:
        lock_for(
            changed_entry,
            changed_options,
            matrix_path=matrix_path,
            locked=True,
            knowledge=knowledge,
        )
    (line,) = error.value.message.splitlines()
    assert f"{path} is stale (" in line
    assert line.endswith(f"run envbuild lock -m {matrix_path}")


def test_a_missing_lock_under_locked_is_one_line(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    with pytest.raises(BadInput, match=r"team\.lock/.*\.txt is missing; run envbuild lock -m"):
        lock_for(
            entry, offline(wheelhouse), matrix_path=matrix_path, locked=True, knowledge=knowledge
        )
    with pytest.raises(BadInput, match="is missing"):
        locks_for((entry,), offline(wheelhouse), matrix_path, knowledge, locked=True)
    found = locks_for((entry,), offline(wheelhouse), matrix_path, knowledge, locked=False)
    assert found[entry.id].path == matrix_path.parent / "team.lock" / f"{entry.id}.txt"


def test_without_locked_a_missing_lock_is_resolved_and_written(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    heard: list[str] = []
    lock = lock_for(
        entry, offline(wheelhouse), matrix_path=matrix_path, locked=False,
        knowledge=knowledge, note=heard.append,
    )  # fmt: skip
    assert lock.path is not None
    assert lock.path.read_text(encoding="utf-8") == lock.text
    assert heard == [f"{entry.id}: lock written: {lock.path}"]


def test_a_lock_without_a_matrix_lives_in_the_cache_named_by_its_inputs(
    entry: Entry,
    knowledge: Knowledge,
    wheelhouse: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lock = lock_for(entry, offline(wheelhouse), matrix_path=None, locked=False, knowledge=knowledge)
    assert lock.path is not None
    assert lock.path.parent == tmp_path / "cache" / "envbuild" / "locks"
    assert lock.path.name.startswith(f"{entry.id}-")


def test_an_unsatisfiable_entry_gets_a_lock_saying_why_and_is_excluded_and_refused(
    entry: Entry, knowledge: Knowledge, wheelhouse: Path, matrix_path: Path
) -> None:
    options = offline(wheelhouse)
    conflicting = dataclasses.replace(entry, packages=("needs-new-torch", "numpy"))
    update = update_lock(conflicting, options, knowledge, matrix_path=matrix_path)
    reason = update.unresolvable
    assert reason is not None
    assert "torch>=2.6" in reason
    assert "torch==2.4.1" in reason
    assert "\n" not in reason
    assert pins(update.text) == {}
    assert lock_state(conflicting, options, matrix_path, knowledge) == "unresolvable"
    with pytest.raises(BadInput) as error:
        lock_for(conflicting, options, matrix_path=matrix_path, locked=False, knowledge=knowledge)
    (line,) = error.value.message.splitlines()
    assert line.startswith(f"{entry.id}: its packages cannot be installed with torch==2.4.1: ")
    plan, states = plan_with_locks(
        Plan(entries=(conflicting,), excluded=()), options, matrix_path, knowledge
    )
    assert plan.entries == ()
    assert states == {}
    assert "torch>=2.6" in plan.excluded[0].reason
    with pytest.raises(BadInput, match="cannot be installed"):
        locks_for((conflicting,), options, matrix_path, knowledge, locked=False)


def test_the_resolver_reason_is_one_line_in_either_of_uvs_formats() -> None:
    plain = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because transformers==4.50.0 depends on torch>=2.6 and you require\n"
        "         torch==2.4.1, we can conclude that your requirements are unsatisfiable.\n"
        "  hint: pass --prerelease\n"
    )
    fancy = plain.replace("error:", "  \u00d7").replace("cause:", "╰─▶").replace("hint:", "help:")
    for text in (plain, "\x1b[31m" + fancy + "\x1b[0m"):
        unsatisfiable, reason = one_line_reason(text)
        assert unsatisfiable
        assert reason == (
            "Because transformers==4.50.0 depends on torch>=2.6 and you require torch==2.4.1, "
            "we can conclude that your requirements are unsatisfiable."
        )
    failed, line = one_line_reason(
        f"error: Request failed\n  cause: Failed to fetch: https://u:{SECRET}@h/simple/x/\n"
        "  cause: dns error\n"
    )
    assert not failed
    assert line == "Request failed: Failed to fetch: https://***@h/simple/x/ : dns error"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout + result.stderr


def test_lock_check_and_plan_through_the_cli(wheelhouse: Path, matrix_path: Path) -> None:
    common = ["-m", str(matrix_path), "--offline", "--wheelhouse", str(wheelhouse)]
    code, out = _cli("lock", "--check", *common)
    assert code == 1
    assert "1 of 1 locks would change" in out
    assert not (matrix_path.parent / "team.lock").exists()
    code, out = _cli("plan", *common)
    assert code == 0
    assert "locks in team.lock/: 1 missing" in out
    code, out = _cli("lock", *common)
    assert code == 0
    assert "+ tinyb 1.0" in out
    code, out = _cli("lock", "--check", *common)
    assert code == 0
    assert "unchanged" in out
    result = CliRunner().invoke(main, ["plan", "--format", "json", *common])
    assert json.loads(result.stdout)["entries"][0]["lock"] == "fresh"
    code, out = _cli("plan", "-p", "rich", *common)
    assert "1 stale" in out
    code, out = _cli(
        "render", "--locked", "-p", "rich", "-o", str(matrix_path.parent / "o"), *common
    )
    assert code == 2
    assert "is stale (packages changed); run envbuild lock -m" in out


def test_no_credential_reaches_a_lock_or_any_output(
    wheelhouse: Path, matrix_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forget_all()  # the CLI must register it, not the test
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # a refused connection fails at once
    url = f"https://user:{SECRET}@127.0.0.1:9/simple"
    common = ["-m", str(matrix_path), "--wheelhouse", str(wheelhouse), "--index-url", url]
    code, out = _cli("lock", "--offline", *common)
    assert code == 0, out
    written = (matrix_path.parent / "team.lock").rglob("*")
    texts = [out, *(p.read_text(encoding="utf-8") for p in written if p.is_file())]
    assert "https://127.0.0.1:9/simple" in texts[1]
    code, failed = _cli("lock", "--upgrade", *common)  # online: the index refuses the connection
    assert code == 1
    assert all(line.startswith("envbuild: error: ") for line in failed.strip().splitlines()[1:])
    for text in [*texts, failed]:
        assert SECRET not in text
        assert "user:" not in text


@pytest.fixture
def read_only_matrix(tmp_path: Path) -> Iterator[Path]:
    """team.yaml on a tmpfs remounted read-only: a real EROFS, which root cannot write through
    either (a file mode would not stop root). Needs root, as CI has; skipped elsewhere."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=False).returncode:  # fmt: skip
        pytest.skip("mounting a read-only folder needs root")
    try:
        (folder / "team.yaml").write_text(yaml.safe_dump(MATRIX), encoding="utf-8")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder / "team.yaml"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_matrix_in_a_read_only_folder_still_builds_with_a_cached_lock(
    knowledge: Knowledge,
    wheelhouse: Path,
    read_only_matrix: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (entry,) = make_plan(knowledge, load_matrix(read_only_matrix, knowledge), Selection()).entries
    heard: list[str] = []

    def build() -> Path | None:
        lock = lock_for(
            entry, offline(wheelhouse), matrix_path=read_only_matrix, locked=False,
            knowledge=knowledge, note=heard.append,
        )  # fmt: skip
        assert pins(lock.text) == {"numpy": "2.0.0", "tinyb": "1.0", "torch": "2.4.1"}
        return lock.path

    first = build()
    assert first is not None
    assert first.parent == tmp_path / "cache" / "envbuild" / "locks"
    assert first.read_text(encoding="utf-8").count("--hash=sha256:") == 3
    beside = read_only_matrix.parent / "team.lock"
    assert heard == [f"{entry.id}: {beside} cannot be written; lock kept in {first}"]
    first.write_text(first.read_text(encoding="utf-8") + "# kept\n", encoding="utf-8")
    assert build() == first  # read again from the cache, not resolved afresh
    assert first.read_text(encoding="utf-8").endswith("# kept\n")
    with pytest.raises(BadInput, match="is missing; run envbuild lock"):
        lock_for(
            entry, offline(wheelhouse), matrix_path=read_only_matrix, locked=True,
            knowledge=knowledge,
        )  # fmt: skip  # --locked builds only locks beside the matrix, never the cache's
    with pytest.raises(BadInput, match="cannot write the lock"):
        update_lock(entry, offline(wheelhouse), knowledge, matrix_path=read_only_matrix)
