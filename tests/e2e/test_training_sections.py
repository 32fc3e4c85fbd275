"""The smoke test runs what training runs: the torch CPU image passes the compiled step, the data
loader's workers, the checkpoint round trip, numpy interop and the import of every locked package;
an image without its compiler fails the compile section with the cause, and a locked package that
cannot be imported fails the smoke test by name."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.docker_support import TEST_INDEX, TORCH_CPU_IMAGE, derive, envbuild

pytestmark = pytest.mark.e2e

IMAGE = TORCH_CPU_IMAGE
SECTIONS = ("compile", "loader", "checkpoint", "numpy", "packages")


def test_the_torch_image_passes_every_training_section(
    torch_cpu_build: tuple[Any, dict[str, Any], list[str]],
) -> None:
    _, report, _ = torch_cpu_build
    (result,) = report["results"]
    smoke = result["smoke"]
    assert smoke["passed"] is True, smoke["checks"]
    for section in SECTIONS:
        assert smoke[section]["seconds"] is not None, section

    compiled = smoke["compile"]
    assert (compiled["device"], compiled["backend"]) == ("cpu", "inductor/c++")
    assert compiled["compiler"] == "/usr/bin/g++"
    assert compiled["loss_fell"] is True
    assert compiled["loss_last"] < compiled["loss_first"]
    assert compiled["compile_seconds"] > 0
    assert compiled["step_ms"] > 0

    loader = smoke["loader"]
    assert loader["workers_seen"] == [0, 1]  # both worker processes made batches
    assert loader["batches"] == 8
    assert loader["batch_bytes"] == 32 * 1024 * 1024  # more than Docker's 64 MB /dev/shm holds
    assert loader["shm_bytes"] == 1024**3  # the image's declared --shm-size=1g
    assert loader["batches_per_s"] > 0
    assert loader["loss_fell"] is True

    checkpoint = smoke["checkpoint"]
    assert checkpoint["continued"] is True
    assert checkpoint["loss_after_resume"] == pytest.approx(checkpoint["loss_uninterrupted"])
    assert checkpoint["loss_after_resume"] < checkpoint["loss_before_save"]

    assert smoke["numpy"]["ok"] is True
    assert smoke["numpy"]["skipped"] is None  # the default lock holds numpy

    packages = smoke["packages"]
    assert packages["ok"] is True
    assert packages["failures"] == []
    assert packages["imported"] == packages["modules"] >= 10  # torch, numpy, sympy, jinja2, ...
    assert packages["distributions"] >= 10
    assert smoke["run_with"] == "--shm-size=1g"  # what a user's docker run needs, as tested


def failing_smoke(tag: str) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """`envbuild smoke TAG --json`, which must fail: the process, its report, the failed checks."""
    result = envbuild("smoke", tag, "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    return result, report, {c["name"]: c["detail"] for c in report["checks"] if not c["passed"]}


@pytest.mark.extended  # a broken image, slow to make: the extended tier
def test_without_its_declared_shm_size_the_loader_fails_and_says_how_to_run_it(
    docker_client: docker.DockerClient, torch_cpu_build: object, tmp_path: Path
) -> None:
    # The same image, its run option taken away: smoke runs it with Docker's default 64 MB
    # /dev/shm, as a user's plain `docker run` would.
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/default-shm:1",
        f'FROM {IMAGE}\nLABEL org.envbuild.run.shm-size=""\n', {},
    )  # fmt: skip
    try:
        _, report, failed = failing_smoke(tag)
        assert set(failed) == {"payload", "data_loader"}
        assert failed["data_loader"].startswith(
            "RuntimeError: the DataLoader's 2 workers ran out of shared memory: /dev/shm holds 64 MB"
        )
        assert "docker run --shm-size=1g" in failed["data_loader"]
        assert report["run_with"] == ""
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize(
    ("sabotage", "cause"),
    [
        ("rm /usr/bin/g++ /usr/bin/c++", "torch.compile needs a C++ compiler (g++) in the image"),
        ("rm -r /usr/include/python3.11", "torch.compile needs Python's C headers (Python.h"),
    ],
    ids=["no-compiler", "no-python-headers"],
)
def test_an_image_without_what_compile_needs_fails_the_compile_section_with_the_cause(
    docker_client: docker.DockerClient,
    torch_cpu_build: object,
    tmp_path: Path,
    sabotage: str,
    cause: str,
) -> None:
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/no-compiler:1",
        f"FROM {IMAGE}\nUSER 0:0\nRUN {sabotage}\nUSER 1000:1000\n", {},
    )  # fmt: skip
    try:
        result, report, failed = failing_smoke(tag)
        # Training, all-reduce and the other sections still pass.
        assert set(failed) == {"payload", "compiled_step"}
        assert failed["compiled_step"].startswith(f"RuntimeError: {cause}")
        assert failed["payload"].startswith(f"compile: RuntimeError: {cause}")
        assert cause in result.stderr
        assert report["compile"]["loss_fell"] is False
        for section in ("loader", "checkpoint", "numpy", "packages"):
            assert report[section]["seconds"] is not None, section
        assert report["packages"]["ok"] is True
    finally:
        docker_client.images.remove(tag, force=True)


# --------------------------------------------------------------------------
# a locked package that cannot be imported

BROKEN = "envbuild-broken-import"
BROKEN_MODULE = "envbuild_broken_import"
BROKEN_ERROR = "ImportError: libteam.so.3: cannot open shared object file"
MATRIX = """\
defaults:
  python: "3.11"
  os: bookworm
  repository: "envbuild-test/broken-{{framework}}"
  packages: [{broken}]
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def broken_wheel(folder: Path) -> Path:
    """A real, installable wheel whose only module raises ImportError when imported."""
    info = f"{BROKEN_MODULE}-1.0.dist-info"
    files = {
        f"{BROKEN_MODULE}/__init__.py": (
            f"raise ImportError({BROKEN_ERROR.split(': ', 1)[1]!r})\n"
        ).encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {BROKEN}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: envbuild-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
        f"{info}/top_level.txt": f"{BROKEN_MODULE}\n".encode(),
    }
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    record += f"{info}/RECORD,,\n"
    path = folder / f"{BROKEN_MODULE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", record)
    return path


@pytest.mark.extended  # a broken image, slow to make: the extended tier
def test_a_locked_package_that_cannot_be_imported_fails_the_smoke_test_by_name(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for wheel in wheelhouse.glob("*.whl"):
        (house / wheel.name).hardlink_to(wheel)
    broken_wheel(house)
    team = tmp_path / "team.yaml"
    team.write_text(MATRIX.format(broken=BROKEN))
    given = ["--base-image", base_image, "--wheelhouse", str(house),
             "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX]  # fmt: skip
    locked = envbuild("lock", "-m", str(team), *given)
    assert locked.returncode == 0, locked.stderr[-3000:]
    report = tmp_path / "r.json"
    built = envbuild("build", "-m", str(team), "--locked", *given, "--report", str(report))
    assert built.returncode == 1, built.stderr[-3000:]
    (result,) = json.loads(report.read_text())["results"]
    smoke = result["smoke"]
    assert smoke["passed"] is False
    named = f"{BROKEN}: {BROKEN_MODULE}: {BROKEN_ERROR}"
    assert smoke["packages"]["failures"] == [named]
    assert smoke["packages"]["imported"] == smoke["packages"]["modules"] - 1
    failed = {c["name"]: c["detail"] for c in smoke["checks"] if not c["passed"]}
    assert set(failed) == {"payload", "packages_import"}
    assert named in failed["packages_import"]
    assert named in failed["payload"]
    assert named in built.stderr + built.stdout
