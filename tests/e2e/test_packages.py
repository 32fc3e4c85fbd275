"""The team's packages, locked and built exactly: a CPU torch image with a matrix's packages, an
edited lock that the image honours, a stale lock that `--locked` refuses, and a package that
needs another torch, excluded with the resolver's reason."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import docker
import pytest
import uv

from tests.support.docker_support import TEST_INDEX, envbuild, output_of

pytestmark = pytest.mark.e2e

REPOSITORY = "envbuild-test/pkgs-{framework}"
IMAGE = "envbuild-test/pkgs-torch:2.13.0-cpu-py3.11-bookworm"
ENTRY = "torch2.13.0-cpu-py3.11-bookworm"
MATRIX = """\
defaults:
  python: "3.11"
  os: bookworm
  repository: "{repository}"
  packages: [{packages}]
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""
# One requirement's block in uv's output: the pin, its hash lines, then uv's annotations.
BLOCK = r"^{name}==[^\n]*\\\n(?:[ ]+--hash=[^\n]*\n)+"


def matrix(folder: Path, name: str, packages: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(MATRIX.format(repository=REPOSITORY, packages=packages))
    return path


def options(base_image: str, wheelhouse: Path, ca_bundle: Path) -> list[str]:
    return ["--base-image", base_image, "--wheelhouse", str(wheelhouse),
            "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX]  # fmt: skip


def pinned_block(requirement: str, ca_bundle: Path) -> str:
    """uv's hashed block for one exact requirement, resolved for the image's platform."""
    done = subprocess.run(
        [uv.find_uv_bin(), "pip", "compile", "-", "--generate-hashes", "--no-header", "--no-deps",
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36", "--quiet"],
        input=requirement + "\n", capture_output=True, text=True, timeout=120, check=True,
        env={"SSL_CERT_FILE": str(ca_bundle), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    name = requirement.split("==")[0]
    found = re.search(BLOCK.format(name=name), done.stdout, re.MULTILINE)
    assert found is not None, done.stdout
    return found.group(0)


def test_packages_are_locked_and_the_image_installs_exactly_the_lock(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    team = matrix(tmp_path, "team", "six")
    given = options(base_image, wheelhouse, ca_bundle)
    locked = envbuild("lock", "-m", str(team), *given)
    assert locked.returncode == 0, locked.stderr[-3000:]
    lock = tmp_path / "team.lock" / f"{ENTRY}.txt"
    text = lock.read_text()
    assert re.search(r"^six==", text, re.MULTILINE)
    assert re.search(r"^numpy==", text, re.MULTILINE)  # in every image unless the matrix says no
    assert "s3cret" not in text  # the index password never reaches a lock

    # An older six, put into the lock by hand with its real hashes: the image must have it.
    older = re.sub(BLOCK.format(name="six"), pinned_block("six==1.16.0", ca_bundle), text,
                   flags=re.MULTILINE)  # fmt: skip
    assert older != text
    lock.write_text(older)

    report = tmp_path / "r.json"
    built = envbuild("build", "-m", str(team), "--locked", *given, "--report", str(report))
    assert built.returncode == 0, built.stderr[-3000:]
    (result,) = json.loads(report.read_text())["results"]
    assert result["status"] == "built"
    assert result["smoke"]["passed"] is True
    out = output_of(docker_client,
        IMAGE,
        ["python3", "-c",
         "import six, numpy; print(six.__version__); print(open('/opt/venv/envbuild.lock').read())"],
        network_mode="none",
    ).decode()  # fmt: skip
    version, kept = out.split("\n", 1)
    assert version == "1.16.0"
    assert kept.rstrip("\n") == older.rstrip("\n")

    # Reproducible: the same lock built again from nothing (--no-cache) installs the same
    # distributions, and the image is named by the same content hash.
    first = docker_client.images.get(IMAGE)
    freeze = ["python3", "-m", "pip", "freeze", "--all"]
    frozen = output_of(docker_client, IMAGE, freeze, network_mode="none")
    again = envbuild("build", "-m", str(team), "--locked", *given, "--no-cache", "--no-smoke")
    assert again.returncode == 0, again.stderr[-3000:]
    second = docker_client.images.get(IMAGE)
    assert second.id != first.id  # really built again
    assert second.labels["org.envbuild.content-hash"] == first.labels["org.envbuild.content-hash"]
    assert output_of(docker_client, IMAGE, freeze, network_mode="none") == frozen
    # Not its parents: with --no-cache the framework image was built again and its tag moved, so
    # the old chain is untagged down to the OS + Python stage, which another lane's build may be
    # about to find in its cache (test_matrix_cpu checks it does). The session's end prunes them.
    docker_client.images.remove(first.id, force=True, noprune=True)

    # The matrix asks for another package: its lock is stale, and --locked refuses to build.
    matrix(tmp_path, "team", "six, tqdm")
    stale = envbuild("build", "-m", str(team), "--locked", *given, "--no-smoke")
    assert stale.returncode == 2, stale.stderr[-3000:]
    (line,) = [text for text in stale.stderr.splitlines() if text.strip()]
    assert f"team.lock/{ENTRY}.txt is stale (packages changed)" in line
    assert line.endswith(f"run envbuild lock -m {team}")


def test_a_package_that_needs_another_torch_excludes_the_entry_with_the_reason(
    base_image: str, wheelhouse: Path, ca_bundle: Path, tmp_path: Path
) -> None:
    conflict = matrix(tmp_path, "conflict", '"torchvision==0.20.0"')  # needs torch==2.5.0
    given = options(base_image, wheelhouse, ca_bundle)
    locked = envbuild("lock", "-m", str(conflict), *given)
    assert locked.returncode == 0, locked.stderr[-3000:]
    assert f"{ENTRY}: unresolvable:" in locked.stdout
    plan = envbuild("plan", "-m", str(conflict), *given, "--format", "json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    document = json.loads(plan.stdout)
    assert document["entries"] == []
    (excluded,) = document["excluded"]
    assert "torch" in excluded["reason"]
    assert "torchvision" in excluded["reason"]
    build = envbuild("build", "-m", str(conflict), *given, "--no-smoke")
    assert build.returncode == 2, build.stderr[-3000:]
    assert "its packages cannot be installed with torch==2.13.0+cpu" in build.stderr
