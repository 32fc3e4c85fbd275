"""The training sections of the smoke payload that run without torch: the lock's pins, the modules
of an installed distribution (a real dist-info folder in tmp_path), the child interpreter that
imports them (real tiny modules: one raises, one kills the interpreter, one hangs), and the torch
payload's report shape and compiler diagnosis."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuild.payload import smoke_harness as harness

PAYLOAD = Path(harness.__file__).parent


LOADED = (
    "torch_smoke", "torch_ranks", "smoke_harness", "smoke_verdicts", "package_imports",
    "payload_versions",
)  # fmt: skip


@pytest.fixture(scope="module")
def torch_smoke() -> Iterator[ModuleType]:
    """torch_smoke.py as the container imports it (`import smoke_harness` from its folder); it
    needs torch only inside its sections."""
    sys.path.insert(0, str(PAYLOAD))
    try:
        yield importlib.import_module("torch_smoke")
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in LOADED:
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def imports() -> Iterator[ModuleType]:
    """package_imports.py as the container imports it (`import smoke_harness` from its folder)."""
    sys.path.insert(0, str(PAYLOAD))
    try:
        yield importlib.import_module("package_imports")
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in LOADED:
            sys.modules.pop(name, None)


# --------------------------------------------------------------------------
# the lock


def block(name: str, version: str, *, extras: str = "", marker: str = "") -> str:
    digest = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
    tail = f" ; {marker}" if marker else ""
    return (
        f"{name}{extras}=={version}{tail} \\\n"
        f"    --hash=sha256:{digest} \\\n"
        f"    --hash=sha256:{digest[::-1]}\n"
        f"    # via\n    #   torch\n"
    )


def test_the_locks_pins_are_read_and_hash_and_comment_lines_skipped(imports: ModuleType) -> None:
    text = (
        "# envbuild lock for torch2.13.0-cpu-py3.11-bookworm\n# packages: six\n"
        + block("torch", "2.13.0+cpu")
        + block("typing-extensions", "4.15.0")
        + block("Jinja2", "3.1.6", extras="[i18n]")
        + block("zope.interface", "7.0", marker='python_version >= "3.9"')
        + "\n"
    )
    assert imports.lock_pins(text) == [
        ("torch", "2.13.0+cpu"),
        ("typing-extensions", "4.15.0"),
        ("Jinja2", "3.1.6"),
        ("zope.interface", "7.0"),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "    --hash=sha256:" + "a" * 64,
        "# torch==2.13.0",
        "    # via torch==2.13.0",
        "-e ./local",
        "--index-url https://example.invalid/simple",
        "torch>=2.0",
        "",
        "\t torch==1.0 \\",
    ],
)
def test_lines_that_are_not_pins_give_none(imports: ModuleType, line: str) -> None:
    assert imports.lock_pins(line + "\n" + block("six", "1.17.0")) == [("six", "1.17.0")]


# --------------------------------------------------------------------------
# a distribution's modules, from its installed metadata


def install(site: Path, name: str, files: dict[str, str], *, top_level: str | None = None) -> None:
    """A distribution as an installer leaves it: its files, and a dist-info with a RECORD."""
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    (site / info).mkdir(parents=True)
    (site / info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    records = [*files, f"{info}/METADATA"]
    if top_level is not None:
        (site / info / "top_level.txt").write_text(top_level)
        records.append(f"{info}/top_level.txt")
    for relative, text in files.items():
        if relative.startswith(".."):
            continue  # a script outside site-packages: listed, never imported
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    lines = [f"{r},sha256=x,1\n" for r in records]
    (site / info / "RECORD").write_text("".join(lines) + f"{info}/RECORD,,\n")


def modules_of(imports: ModuleType, site: Path, name: str) -> list[str]:
    dist = imports.find_distribution(name, [str(site)])
    assert dist is not None, name
    return imports.top_level_modules(dist)


def test_modules_come_from_the_record_without_metadata_caches_pth_scripts_or_private_names(
    imports: ModuleType, tmp_path: Path
) -> None:
    install(
        tmp_path,
        "team-tools",
        {
            "team_tools/__init__.py": "",
            "team_tools/__pycache__/__init__.cpython-311.pyc": "",
            "single.py": "",
            "fastext.cpython-311-x86_64-linux-gnu.so": "",
            "_private_helper.py": "",
            "team_tools-extra.pth": "import team_tools\n",
            "__pycache__/single.cpython-311.pyc": "",
            "share/data.txt": "",
            "../../../bin/team-tool": "",
        },
    )
    # Any spelling of the name finds it, as a lock spells it.
    for spelling in ("team-tools", "team_tools", "Team-Tools"):
        assert modules_of(imports, tmp_path, spelling) == ["fastext", "single", "team_tools"]


def test_top_level_txt_wins_but_only_names_that_were_installed(
    imports: ModuleType, tmp_path: Path
) -> None:
    install(
        tmp_path,
        "withtop",
        {"realpkg/__init__.py": "", "realpkg/sub/mod.py": "", "other.py": ""},
        top_level="realpkg\nstale_name_never_installed\n\n",
    )
    assert modules_of(imports, tmp_path, "withtop") == ["realpkg"]


def test_private_names_are_kept_when_they_are_all_there_is(
    imports: ModuleType, tmp_path: Path
) -> None:
    install(tmp_path, "only-private", {"_speedups/__init__.py": "", "_cffi_backend.py": ""})
    assert modules_of(imports, tmp_path, "only-private") == ["_cffi_backend", "_speedups"]


def test_a_distribution_that_is_not_installed_is_none(imports: ModuleType, tmp_path: Path) -> None:
    install(tmp_path, "present", {"present.py": ""})
    assert imports.find_distribution("absent-dist", [str(tmp_path)]) is None


# --------------------------------------------------------------------------
# importing them in a child interpreter

MODULES = {
    "good_one": "VALUE = 1\n",
    "noisy": "print('{not json at all')\nimport sys\nsys.stdout.write('more noise\\n')\n",
    "raises": "raise ImportError('libfoo.so.1: cannot open shared object file')\n",
    "exits": "import sys\nsys.exit(4)\n",
    "kills": "import os\nos._exit(7)\n",
    "hangs": "import time\ntime.sleep(600)\n",
    "good_two": "VALUE = 2\n",
}


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tmp_path


def test_each_import_is_judged_and_none_takes_the_runner_down(
    imports: ModuleType, modules: Path
) -> None:
    order = list(MODULES)
    results = imports.import_modules(order, deadline_s=100, hang_s=3, path=[str(modules)])
    assert list(results) == order  # all of them, in order, the later ones after the crashes
    assert results["good_one"] is None
    assert results["noisy"] is None  # what an import prints cannot corrupt the results
    assert results["good_two"] is None
    assert results["raises"] == "ImportError: libfoo.so.1: cannot open shared object file"
    assert results["exits"] == "SystemExit: 4"
    assert results["kills"] == "the interpreter died importing it (exit code 7)"
    assert results["hangs"] == "no result within 3 s (hung?), killed"


def test_what_the_deadline_leaves_is_reported_as_not_tried(
    imports: ModuleType, modules: Path
) -> None:
    results = imports.import_modules(
        ["hangs", "good_one"], deadline_s=2, hang_s=60, path=[str(modules)]
    )
    assert results["good_one"] is not None
    assert results["good_one"].startswith("not tried")
    assert results["hangs"] is not None


def test_a_broken_interpreter_fails_every_module_instead_of_looping(
    imports: ModuleType, tmp_path: Path
) -> None:
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    results = imports.import_modules(["json", "os"], deadline_s=30, python=str(python))
    assert results == {
        "json": "the import child exited 3 before trying it",
        "os": "the import child exited 3 before trying it",
    }


# --------------------------------------------------------------------------
# the packages section: the lock, the metadata and the child together


def test_the_packages_section_names_each_failure_by_distribution_and_module(
    imports: ModuleType, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    install(site, "good-dist", {"good_mod/__init__.py": "", "good_mod/core.py": ""})
    install(site, "broken-dist", {"broken_mod.py": "raise ImportError('no libbroken')\n"})
    install(site, "empty-dist", {"empty_dist-data.txt": ""})
    install(site, "damaged-dist", {"damaged.py": ""})
    record = site / "damaged_dist-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + "damaged.py,sha256=x,1,extra,fields\n")
    lock = tmp_path / "envbuild.lock"
    lock.write_text(
        block("good-dist", "1.0") + block("broken-dist", "1.0") + block("empty-dist", "1.0")
        + block("missing-dist", "2.0") + block("damaged-dist", "1.0")
    )  # fmt: skip
    part = imports.packages_part()
    with pytest.raises(RuntimeError) as failed:
        imports.check_packages(part, deadline_s=60, lock_path=str(lock), path=[str(site)])
    (damaged,) = [f for f in part["failures"] if f.startswith("damaged-dist: ")]
    assert damaged.startswith("damaged-dist: its installed metadata cannot be read: TypeError")
    assert [f for f in part["failures"] if f != damaged] == [
        "missing-dist: not installed (the lock pins it)",
        "broken-dist: broken_mod: ImportError: no libbroken",
    ]
    assert (part["distributions"], part["modules"], part["imported"]) == (5, 2, 1)
    assert part["without_modules"] == ["empty-dist"]
    assert part["ok"] is False
    assert "broken-dist: broken_mod: ImportError: no libbroken" in str(failed.value)
    json.dumps(harness.clean_json(part), allow_nan=False)


def test_an_image_without_a_lock_skips_the_packages_section(
    imports: ModuleType, tmp_path: Path
) -> None:
    part = imports.packages_part()
    imports.check_packages(part, deadline_s=10, lock_path=str(tmp_path / "none.lock"))
    assert part["ok"] is True
    assert "no lock at" in part["skipped"]


# --------------------------------------------------------------------------
# the torch payload's report and its compiler diagnosis


def test_every_check_of_the_torch_payload_reads_a_part_it_reports(
    torch_smoke: ModuleType,
) -> None:
    parts = torch_smoke.training_parts()
    names = [name for name, _, _ in harness.TRAINING_CHECKS]
    assert len(names) == len(set(names))
    for name, part, key in harness.TRAINING_CHECKS:
        assert key in parts[part], (name, part, key)
    run = harness.Run("torch", parts=parts, checks=harness.TRAINING_CHECKS)
    # Nothing ran yet: no section may pass by default.
    assert not any(run.checks().values())
    assert {"compile", "loader", "checkpoint", "numpy", "packages"} <= set(run.document())


@pytest.mark.parametrize(
    ("text", "cuda", "cause"),
    [
        (
            "InvalidCxxCompiler: No working C++ compiler found in "
            "torch._inductor.config.cpp.cxx: (None, 'g++')",
            False,
            "torch.compile needs a C++ compiler (g++) in the image",
        ),
        (
            "CppCompileError: C++ compile error ... main.cpp:35:10: fatal error: Python.h: "
            "No such file or directory",
            False,
            "torch.compile needs Python's C headers (Python.h, e.g. libpython3-dev) in the image",
        ),
        (
            "RuntimeError: Failed to find C compiler. Please specify via CC environment variable.",
            True,
            "torch.compile needs a C compiler (gcc) in the image for triton's launcher",
        ),
        ("RuntimeError: shape mismatch in mm", False, None),
    ],
)
def test_a_missing_toolchain_is_named_as_the_cause(
    torch_smoke: ModuleType, text: str, cuda: bool, cause: str | None
) -> None:
    assert torch_smoke.compiler_problem(RuntimeError(text), cuda) == cause


# --------------------------------------------------------------------------
# the loader's /dev/shm diagnosis

MB = 2**20
BATCH = 32 * MB  # the smoke loader's batch: 512 x 16384 float32
SHM_PREFIX = (
    "the DataLoader's 2 workers ran out of shared memory: /dev/shm holds 64 MB and each batch "
    "takes 32 MB there (4 prefetched: 128 MB); run the image as it was tested, with docker run "
    "--shm-size=1g"
)


@pytest.mark.parametrize(
    "text",
    [
        # each way torch says it, depending on where the worker ran out (CI saw the first three)
        "DataLoader worker (pid 42) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
        "DataLoader timed out after 60.0 seconds",
        "DataLoader worker (pid(s) 42, 43) exited unexpectedly",
        "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback ...\n"
        "RuntimeError: unable to write to file </torch_42_1_0>: No space left on device (28)",
    ],
)
def test_a_loader_short_of_shared_memory_says_how_to_run_the_image(
    torch_smoke: ModuleType, text: str
) -> None:
    said = torch_smoke.loader_shm_problem(text, 64 * MB, 2, BATCH)
    assert said is not None
    assert said.startswith(SHM_PREFIX)
    assert said.endswith(f"; torch said: {text.splitlines()[0][:200]}")


@pytest.mark.parametrize(
    ("text", "shm"),
    [
        # a timeout or a lost worker with room for every prefetched batch is not /dev/shm's doing
        ("DataLoader timed out after 60.0 seconds", 1024 * MB),
        ("DataLoader worker (pid(s) 42) exited unexpectedly", 128 * MB),
        # /dev/shm not measured: no guess
        ("DataLoader timed out after 60.0 seconds", None),
        # another failure with a small /dev/shm is that failure
        ("mat1 and mat2 shapes cannot be multiplied (512x16384 and 100x32)", 64 * MB),
        ("", 64 * MB),
    ],
)
def test_other_loader_failures_are_left_as_they_are(
    torch_smoke: ModuleType, text: str, shm: int | None
) -> None:
    assert torch_smoke.loader_shm_problem(text, shm, 2, BATCH) is None


@given(
    text=st.text(max_size=5000),
    shm=st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    workers=st.integers(min_value=1, max_value=64),
    batch=st.integers(min_value=1, max_value=2**34),
)
def test_the_diagnosis_of_any_failure_is_none_or_one_bounded_message(
    torch_smoke: ModuleType, text: str, shm: int | None, workers: int, batch: int
) -> None:
    said = torch_smoke.loader_shm_problem(text, shm, workers, batch)
    if said is None:
        return
    assert said.startswith(f"the DataLoader's {workers} workers ran out of shared memory")
    assert "docker run --shm-size=1g" in said
    assert len(said) < 600
