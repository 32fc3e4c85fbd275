"""A real torch CPU image: built from a wheelhouse and PyPI, smoke-tested, rebuilt as a no-op."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.docker_support import (
    SECRET,
    TEST_INDEX,
    TEST_LABEL,
    TORCH_CPU_IMAGE,
    derive,
    envbuild,
    output_of,
)

pytestmark = pytest.mark.e2e

IMAGE = TORCH_CPU_IMAGE


@pytest.fixture(scope="module")
def first_build(
    torch_cpu_build: tuple[Any, dict[str, Any], list[str]],
) -> tuple[Any, dict[str, Any], list[str]]:
    return torch_cpu_build


def test_the_image_is_built_and_proves_it_trains(
    first_build: tuple[Any, dict[str, Any], list[str]],
) -> None:
    _, report, _ = first_build
    (result,) = report["results"]
    assert result["status"] == "built"
    assert result["entry"]["id"] == "torch2.13.0-cpu-py3.11-bookworm"
    assert IMAGE in result["image"]["tags"]
    smoke = result["smoke"]
    assert smoke["passed"] is True
    assert all(check["passed"] for check in smoke["checks"])
    assert smoke["train"]["loss_last"] < smoke["train"]["loss_first"]
    allreduce = smoke["allreduce"]
    assert (allreduce["backend"], allreduce["world_size"], allreduce["correct"]) == (
        "gloo",
        2,
        True,
    )
    assert allreduce["got"] == allreduce["expected"] == 3.0
    assert allreduce["busbw_gbps"] == pytest.approx(allreduce["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert smoke["versions"]["framework"] == "2.13.0+cpu"
    assert smoke["versions"]["cuda"] is None
    # Every section ran as the image's non-root user: the compiled step (its kernels cached
    # under HOME), the DataLoader's workers (/dev/shm), the checkpoint (a temporary folder).
    user = smoke["user"]
    assert (user["uid"], user["gid"], user["name"]) == (1000, 1000, "envbuild")
    assert user["unwritable"] == {}
    assert user["environment_writable"] == []
    checks = {check["name"]: check["passed"] for check in smoke["checks"]}
    for name in ("user", "compiled_step", "data_loader", "checkpoint_resumed"):
        assert checks[name] is True, name
    assert smoke["compile"]["cache_dir"].startswith("/home/envbuild/.cache/torchinductor/")
    # The whole build's log: each step's header (the classic builder's `Step 3/12 :`, BuildKit's
    # `#8 [stage-1 2/3]`), cached steps included.
    log = Path(result["image"]["log"]).read_text()
    assert len(re.findall(r"^(?:Step \d+/\d+ :|#\d+ \[)", log, re.MULTILINE)) >= 8, log[-2000:]


def test_the_image_is_labelled(docker_client: docker.DockerClient, first_build: object) -> None:
    labels = docker_client.images.get(IMAGE).labels
    assert labels["org.envbuild.framework-version"] == "2.13.0"
    assert labels["org.envbuild.cuda"] == "cpu"
    assert labels["org.envbuild.python"] == "3.11"
    assert len(labels["org.envbuild.content-hash"]) == 64
    assert labels["org.opencontainers.image.version"] == "2.13.0"
    # A numeric non-root user: what Kubernetes' runAsNonRoot verifies without /etc/passwd.
    assert docker_client.images.get(IMAGE).attrs["Config"]["User"] == "1000:1000"
    assert labels["org.envbuild.user"] == "1000:1000"
    # The install step's marker (for finding a dead build's container) ends with the step: no
    # container of the image is taken for a leftover of a build.
    assert labels["org.envbuild.stage"] == "image"


def test_no_helper_file_or_credential_reaches_the_image(
    docker_client: docker.DockerClient, first_build: object
) -> None:
    image = docker_client.images.get(IMAGE)
    history = json.dumps(image.history())
    config = json.dumps(image.attrs)
    # The history shows the installer's path and the build server's URL (a closed port now);
    # never a credential, a CA bundle or the wheelhouse.
    for needle in (SECRET, "ca.crt", "PIP_INDEX_URL", "UV_INDEX_URL", "wheelhouse"):
        assert needle not in history, needle
        assert needle not in config, needle
    listing = output_of(
        docker_client,
        IMAGE,
        [
            "sh",
            "-c",
            "for helper in /install_env.py /framework.lock /envbuild.lock /tmp/envbuild; do "
            "test -e $helper && echo HELPER-PRESENT $helper; done; "
            "test -e /root/.cache/pip && echo PIP-CACHE; "
            "find / -xdev \\( -name ca.crt -o -name 'torch-*.whl' \\) -print",
        ],
        network_mode="none",
        user="0:0",  # the whole file system, root's folders included; the image runs as envbuild
    ).decode()
    assert listing.strip() == ""


def test_the_os_layer_leaves_out_manuals_and_documentation_but_keeps_copyrights(
    docker_client: docker.DockerClient, first_build: object
) -> None:
    # The base has no python3: the OS's own and torch's compiler came from apt (python.j2),
    # whose packages bring documentation (these three folders hold 28 files without it) and
    # manuals (ar's, as', c++filt's, python3.11's).
    docs = "/usr/share/doc/binutils /usr/share/doc/python3.11 /usr/share/doc/libpython3.11-minimal"
    script = (
        "cat /etc/dpkg/dpkg.cfg.d/envbuild-excludes; "
        f"find {docs} -type f | sort; "
        "for m in ar.1.gz as.1.gz c++filt.1.gz python3.11.1.gz; do "
        "test -e /usr/share/man/man1/$m && echo MANUAL $m; done; "
        "command -v g++; test -x /usr/bin/python3.11 && echo /usr/bin/python3.11"
    )
    lines = output_of(docker_client, IMAGE, ["sh", "-c", script], network_mode="none")
    assert lines.decode().splitlines() == [
        "path-exclude=/usr/share/doc/*",
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/info/*",
        "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/lintian/*",
        "path-include=/usr/share/doc/*/copyright",
        "/usr/share/doc/binutils/copyright",
        "/usr/share/doc/libpython3.11-minimal/copyright",
        "/usr/share/doc/python3.11/copyright",
        "/usr/bin/g++",
        "/usr/bin/python3.11",
    ]


def test_the_user_writes_its_home_and_caches_but_not_the_environment(
    docker_client: docker.DockerClient, first_build: object
) -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    script = (
        "id -u; id -g; echo $HOME; "
        "for d in $HOME $XDG_CACHE_HOME $TORCHINDUCTOR_CACHE_DIR $TRITON_CACHE_DIR; do "
        "mkdir -p $d && touch $d/probe && echo wrote $d; done; "
        f"touch {site}/planted.py 2>/dev/null && echo PLANTED-SITE; "
        "touch /opt/venv/bin/planted 2>/dev/null && echo PLANTED-BIN; "
        f"rm -rf {site}/torch 2>/dev/null; test -d {site}/torch || echo REMOVED-TORCH; "
        # Nothing of the environment is the user's or writable by anyone but root.
        "find /opt/venv ! -user root -print -quit; find /opt/venv ! -type l -perm -o=w -print -quit"
    )
    lines = (
        output_of(docker_client, IMAGE, ["sh", "-c", script], network_mode="none").decode().split()
    )
    home = "/home/envbuild"
    assert lines[:3] == ["1000", "1000", home]
    written = [f"{home}", f"{home}/.cache", f"{home}/.cache/torchinductor", f"{home}/.cache/triton"]
    assert lines[3:] == [word for d in written for word in ("wrote", d)]


def test_smoke_fails_when_the_image_runs_as_another_user_than_its_label_says(
    docker_client: docker.DockerClient, first_build: object, tmp_path: Path
) -> None:
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/root-again:1", f"FROM {IMAGE}\nUSER 0:0\n", {}
    )  # fmt: skip
    result = envbuild("smoke", tag, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    failed = {c["name"]: c["detail"] for c in report["checks"] if not c["passed"]}
    assert list(failed) == ["user"]
    assert failed["user"].startswith("ran as 0:0; ")
    assert failed["user"].endswith("the image's org.envbuild.user label says 1000:1000")


def test_no_image_the_build_left_holds_the_index_password(
    docker_client: docker.DockerClient, first_build: object
) -> None:
    # The classic builder keeps each step as an image and writes build arguments into its
    # history; BuildKit keeps the image alone. Index settings reach the one install step as a
    # served file or a secret mount, never as arguments, so no image of the build (the classic
    # install step's are labelled, the image names its entry) holds the password.
    steps = docker_client.images.list(all=True, filters={"label": "org.envbuild.stage=install"})
    entry = docker_client.images.get(IMAGE).labels["org.envbuild.entry-id"]
    steps += docker_client.images.list(filters={"label": f"org.envbuild.entry-id={entry}"})
    assert steps  # the filters find the build's own images
    holding = [i.id for i in steps if SECRET in described(i)]
    assert holding == []


def described(image: Any) -> str:
    """An image's history and config as text ("" once gone: the other lane removed its own)."""
    try:
        return json.dumps(image.history()) + json.dumps(image.attrs)
    except docker.errors.NotFound:
        return ""


def test_the_same_build_again_builds_nothing(
    first_build: tuple[Any, dict[str, Any], list[str]], tmp_path: Path
) -> None:
    _, first, args = first_build
    report = tmp_path / "again.json"
    args = [*args[:-1], str(report), "--no-smoke"]
    result = envbuild(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "not rebuilt" in result.stderr
    (again,) = json.loads(report.read_text())["results"]
    assert again["status"] == "found"
    assert again["image"]["id"] == first["results"][0]["image"]["id"]


def test_smoke_fails_when_torch_differs_from_the_labels(
    docker_client: docker.DockerClient, first_build: object, tmp_path: Path
) -> None:
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/mislabelled:1",
        f'FROM {IMAGE}\nLABEL org.envbuild.framework-version="2.12.0"\n', {},
    )  # fmt: skip
    result = envbuild("smoke", tag, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    failed = {c["name"]: c["detail"] for c in report["checks"] if not c["passed"]}
    assert failed == {"framework_version": "torch 2.13.0+cpu (labels say 2.12.0)"}
    assert "torch 2.13.0+cpu (labels say 2.12.0)" in result.stderr


def test_smoke_fails_when_the_loss_does_not_fall(
    docker_client: docker.DockerClient, first_build: object, tmp_path: Path
) -> None:
    # A broken environment: an optimizer whose step does nothing, loaded by a .pth at start-up.
    sabotage = "import torch.optim\ntorch.optim.SGD.step = lambda self, closure=None: None\n"
    site = "/opt/venv/lib/python3.11/site-packages/"
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/frozen-optimizer:1",
        f"FROM {IMAGE}\nCOPY frozen_optimizer.py frozen_optimizer.pth {site}\n",
        {"frozen_optimizer.py": sabotage, "frozen_optimizer.pth": "import frozen_optimizer\n"},
    )  # fmt: skip
    result = envbuild("smoke", tag)
    assert result.returncode == 1
    assert "FAIL loss_fell" in result.stdout
    assert "smoke test of" in result.stderr


def test_a_users_stopped_container_of_the_image_is_not_a_leftover(
    docker_client: docker.DockerClient, first_build: object
) -> None:
    """envbuild removes stopped containers a dead build left; one a user ran from an envbuild
    image and that exited is theirs, and must survive the next run's clean-up."""
    from envbuild.engine.interface import connect

    mine = docker_client.containers.run(
        IMAGE, ["true"], detach=True, network_mode="none", labels={TEST_LABEL: "1"}
    )
    try:
        mine.wait(timeout=60)
        connect().remove_leftovers()
        mine.reload()
        assert mine.status == "exited"
    finally:
        mine.remove(force=True)


NO_BYTECODE_MATRIX = """\
defaults:
  python: "3.11"
  os: bookworm
  bytecode: false
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""


def test_bytecode_false_builds_an_image_without_pyc_that_still_trains(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
    first_build: tuple[Any, dict[str, Any], list[str]],
) -> None:
    """The matrix's `bytecode: false`: every install step says --no-bytecode, the venv holds no
    .pyc (the default's holds one per module), the framework image is another than the
    default's, and the image still passes the smoke test as its non-root user, which compiles
    what it imports in memory."""
    matrix = tmp_path / "plain.yaml"
    matrix.write_text(NO_BYTECODE_MATRIX)
    report = tmp_path / "r.json"
    # Its own cache (and so its own build log): the session's image has the same entry id.
    state = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "ENVBUILD_DATA_DIR": str(tmp_path / "data")}
    built = envbuild(
        "build", "-m", str(matrix), "--base-image", base_image, "--wheelhouse", str(wheelhouse),
        "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX,
        "--repository", "envbuild-test/plain-{framework}", "--report", str(report), env=state,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert SECRET not in built.stdout + built.stderr
    (result,) = json.loads(report.read_text())["results"]
    assert result["status"] == "built"
    assert result["entry"]["bytecode"] is False
    assert result["smoke"]["passed"] is True
    log = Path(result["image"]["log"]).read_text()
    installers = re.findall(r"python3 /install_env\.py[^\n]*", log)
    assert installers
    assert all("--no-bytecode" in line for line in installers), installers
    assert "envbuild install: 0 files byte-compiled (--no-bytecode)" in log
    count = "find /opt/venv -name '*.pyc' | wc -l"
    plain = result["image"]["tags"][0]
    assert output_of(docker_client, plain, ["sh", "-c", count], network_mode="none") == b"0\n"
    compiled = output_of(docker_client, IMAGE, ["sh", "-c", count], network_mode="none")
    assert int(compiled) > 4000
    # Another framework image and content hash: neither image is ever found for the other.
    (framework,) = re.findall(r"^Step 1/\d+ : FROM (envbuild/framework:\S+)", log, re.MULTILINE)
    labels = {ref: docker_client.images.get(ref).labels for ref in (plain, IMAGE)}
    assert labels[plain]["org.envbuild.content-hash"] != labels[IMAGE]["org.envbuild.content-hash"]
    default_log = Path(first_build[1]["results"][0]["image"]["log"]).read_text()
    assert framework not in default_log
