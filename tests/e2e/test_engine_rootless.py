"""A rootless Docker engine, started by the tests as an unprivileged user (issue 23): it is
rootless, its BuildKit carries a secret to a `RUN` and leaves it in no layer, history entry, config
or output (and a build that leaks it on purpose is caught), its containers reach PyPI through the
host's proxy, `envbuild doctor` answers through it, and `envbuild build --builder buildkit`
builds and smoke-tests the torch CPU entry there with no secret in the image or any output, while
`--builder classic` is refused in one line that names the engine and BuildKit."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.support.docker_support import (
    SECRET,
    TORCH_CPU_IMAGE,
    envbuild,
    needles_in_layers,
    torch_cpu_args,
)
from tests.support.rootless_engine import (  # noqa: F401 - the fixture, found by name
    DOCKER_CLI,
    RootlessEngine,
    rootless_docker,
)

pytestmark = [pytest.mark.e2e, pytest.mark.extended]


@pytest.fixture(scope="module")
def rootless_client(rootless_docker: RootlessEngine) -> Iterator[docker.DockerClient]:  # noqa: F811
    client = docker.DockerClient(base_url=rootless_docker.host, timeout=600)
    yield client
    client.close()


def buildkit_build(
    engine: RootlessEngine, folder: Path, tag: str, secret_files: dict[str, Path]
) -> subprocess.CompletedProcess[str]:
    """`DOCKER_BUILDKIT=1 docker build` of `folder` on `engine`, plain progress, with secrets."""
    secret_args = [f"--secret=id={name},src={path}" for name, path in secret_files.items()]
    return subprocess.run(
        [DOCKER_CLI, "build", "--progress=plain", *secret_args, "--tag", tag, str(folder)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **engine.env, "DOCKER_BUILDKIT": "1"},
        check=False,
    )


def places_holding(
    client: docker.DockerClient,
    engine: RootlessEngine,
    image: str,
    build: subprocess.CompletedProcess[str],
    secret: str,
) -> list[str]:
    """Every place of `image` and its build where `secret` shows: layers, history, config, output."""
    found = needles_in_layers(client, image, [secret.encode()])
    history = engine.docker("history", "--no-trunc", "--format", "{{json .}}", image)
    assert history.returncode == 0, history.stderr
    if secret in history.stdout or secret in json.dumps(client.images.get(image).history()):
        found.append("history")
    if secret in json.dumps(client.images.get(image).attrs):
        found.append("config")
    found += [
        name
        for name, text in (("stdout", build.stdout), ("stderr", build.stderr))
        if secret in text
    ]
    return found


def test_the_engine_is_rootless(rootless_docker: RootlessEngine) -> None:  # noqa: F811
    info = rootless_docker.docker("info", "--format", "{{json .SecurityOptions}}")
    assert info.returncode == 0, info.stderr
    assert "name=rootless" in json.loads(info.stdout)
    # The engine of the environment is another one: the test would prove nothing against it.
    assert rootless_docker.docker("info", "--format", "{{.DockerRootDir}}").stdout.strip() == str(
        rootless_docker.folder / "data"
    )


def test_a_buildkit_secret_mount_reaches_the_run_and_nothing_else(
    rootless_docker: RootlessEngine,  # noqa: F811
    rootless_client: docker.DockerClient,
    base_image: str,
    tmp_path: Path,
) -> None:
    secret = f"rootless-tok-{secrets.token_hex(12)}"
    (tmp_path / "tok").write_text(secret)
    (tmp_path / "ctx").mkdir()
    # The step proves it read the secret by the one thing derived from it the image may keep.
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN --mount=type=secret,id=tok sha256sum /run/secrets/tok | cut -d' ' -f1 > /tok.sha256\n"
    )
    build = buildkit_build(
        rootless_docker, tmp_path / "ctx", "rootless-test/secret", {"tok": tmp_path / "tok"}
    )
    assert build.returncode == 0, build.stderr[-3000:]

    cat = rootless_docker.docker("run", "--rm", "rootless-test/secret", "cat", "/tok.sha256")
    assert cat.returncode == 0, cat.stderr
    digest = subprocess.run(
        ["sha256sum", str(tmp_path / "tok")], capture_output=True, text=True, check=True
    )
    assert cat.stdout.split() == digest.stdout.split()[:1]
    assert (
        places_holding(rootless_client, rootless_docker, "rootless-test/secret", build, secret)
        == []
    )


def test_the_secret_search_finds_a_secret_a_build_leaks(
    rootless_docker: RootlessEngine,  # noqa: F811
    rootless_client: docker.DockerClient,
    base_image: str,
    tmp_path: Path,
) -> None:
    """Sabotage: a build that copies the secret into a layer and prints it is caught in both."""
    secret = f"rootless-leak-{secrets.token_hex(12)}"
    (tmp_path / "tok").write_text(secret)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN --mount=type=secret,id=tok cp /run/secrets/tok /leaked && cat /run/secrets/tok\n"
    )
    build = buildkit_build(
        rootless_docker, tmp_path / "ctx", "rootless-test/leak", {"tok": tmp_path / "tok"}
    )
    assert build.returncode == 0, build.stderr[-3000:]
    found = places_holding(rootless_client, rootless_docker, "rootless-test/leak", build, secret)
    assert any(place.endswith(":leaked") for place in found), found
    assert "stderr" in found, found  # --progress=plain writes the step's output to stderr


@pytest.mark.live
def test_a_build_reaches_pypi_through_the_host_proxy_with_the_ca_bundle(
    rootless_docker: RootlessEngine,  # noqa: F811
    base_image: str,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \\\n"
        "    apt-get update -qq && apt-get install -y -qq --no-install-recommends curl >/dev/null \\\n"
        "    && curl --cacert /etc/ssl/certs/ca-certificates.crt -fsS -o /dev/null \\\n"
        "       -w 'pypi answered %{http_code}\\n' https://pypi.org/simple/six/\n"
    )
    build = buildkit_build(
        rootless_docker, tmp_path / "ctx", "rootless-test/pypi", {"ca": ca_bundle}
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "pypi answered 200" in build.stderr


def test_doctor_answers_through_the_rootless_engine(rootless_docker: RootlessEngine) -> None:  # noqa: F811
    result = envbuild("doctor", "--json", env=rootless_docker.env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["engine"]["reachable"], report["engine"]
    assert report["engine"]["rootless"] is True
    assert report["engine"]["builders"]["buildkit"]["works"] is True
    assert "rootless" in report["engine"]["builders"]["classic"]["why_not"]
    assert report["engine"]["needs"]["secrets"] == "yes: BuildKit secret mounts"
    # The disk doctor measures is the engine's root: this engine's, not the host's rootful one.
    assert report["disk"]["path"] == str(rootless_docker.folder / "data")


@pytest.mark.live
def test_envbuild_builds_and_smoke_tests_torch_cpu_with_buildkit_and_leaks_no_secret(
    rootless_docker: RootlessEngine,  # noqa: F811
    rootless_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    report_path = tmp_path / "r.json"
    args = [
        *torch_cpu_args(base_image, wheelhouse, ca_bundle, report_path),
        "--builder",
        "buildkit",
    ]
    result = envbuild(*args, env=rootless_docker.env, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(report_path.read_text())
    (entry,) = report["results"]
    assert entry["status"] == "built"
    assert TORCH_CPU_IMAGE in entry["image"]["tags"]
    smoke = entry["smoke"]
    assert smoke["passed"] is True
    assert all(check["passed"] for check in smoke["checks"])
    assert smoke["versions"]["framework"] == "2.13.0+cpu"
    assert smoke["train"]["loss_last"] < smoke["train"]["loss_first"]
    # Built on the rootless engine, not on the engine of the environment.
    rootless_client.images.get(TORCH_CPU_IMAGE)

    found = needles_in_layers(rootless_client, TORCH_CPU_IMAGE, [SECRET.encode()])
    image = rootless_client.images.get(TORCH_CPU_IMAGE)
    history = rootless_docker.docker(
        "history", "--no-trunc", "--format", "{{json .}}", TORCH_CPU_IMAGE
    )
    assert history.returncode == 0, history.stderr
    outputs = {
        "history": history.stdout + json.dumps(image.history()),
        "config": json.dumps(image.attrs),
        "stdout": result.stdout,
        "stderr": result.stderr,
        "report": report_path.read_text(),
        "build log": Path(entry["image"]["log"]).read_text(errors="replace"),
    }
    found += [place for place, text in outputs.items() if SECRET in text]
    assert found == []


def test_the_classic_builder_is_refused_there_in_one_line_naming_buildkit(
    rootless_docker: RootlessEngine,  # noqa: F811
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    """The classic builder serves inputs from this host, which a rootless engine's networks
    (in rootlesskit's namespace) cannot reach: the build stops before it starts."""
    args = [
        *torch_cpu_args(base_image, wheelhouse, ca_bundle, tmp_path / "r.json"),
        "--builder",
        "classic",
    ]
    result = envbuild(*args, env=rootless_docker.env, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert "rootless" in line, line
    assert rootless_docker.host in line, line
    assert "--builder buildkit" in line, line
    assert SECRET not in result.stdout + result.stderr
