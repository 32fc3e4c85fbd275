"""A remote engine as GitLab CI's `docker:dind` service serves one (tests/support/dind_engine.py):
reached only with TLS client certificates, building with BuildKit secrets that no layer, history
entry or output keeps, and named by `envbuild doctor`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest

from tests.support.dind_engine import (  # noqa: F401 - dind_fixture: the fixture `dind`
    DOCKER_CLI,
    DindEngine,
    dind_fixture,
    make_certs,
)
from tests.support.docker_support import (
    SECRET,
    TORCH_CPU_IMAGE,
    needles_in_layers,
    output_of,
    torch_cpu_args,
)

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

# requests lets these replace docker-py's CA for the engine (docker-py issues #2433, #2598);
# this host sets both for its TLS-intercepting proxy.
CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def docker_cli(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Debian's docker client (20.10) with `env` over this process's environment."""
    return subprocess.run(
        [DOCKER_CLI, *args], capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


def envbuild_cli(
    env: dict[str, str], *args: str, drop: tuple[str, ...] = (), timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """The installed CLI with `env` over this process's environment, less the names in `drop`."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *args], capture_output=True, text=True,
        timeout=timeout, check=False, env={**base, **env},
    )  # fmt: skip


def test_the_engine_answers_only_with_a_client_certificate(
    dind: DindEngine, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    reached = docker_cli(dind.env, "info", "--format", "{{.ID}}")
    assert reached.returncode == 0, reached.stderr
    # It is the dind engine that answered, not the host's.
    assert reached.stdout.strip() == dind.client.info()["ID"] != docker_client.info()["ID"]

    plain = docker_cli({"DOCKER_HOST": dind.host}, "version")
    assert plain.returncode != 0
    assert "Client sent an HTTP request to an HTTPS server" in plain.stderr

    only_ca = tmp_path / "only-ca"  # trusts the engine, but has no certificate of its own
    only_ca.mkdir()
    shutil.copy(dind.certs.client / "ca.pem", only_ca)
    anonymous = docker_cli({**dind.env, "DOCKER_CERT_PATH": str(only_ca)}, "version")
    assert anonymous.returncode != 0
    assert "tls: bad certificate" in anonymous.stderr, anonymous.stderr

    foreign = tmp_path / "foreign"  # a client certificate the engine's CA did not sign
    other = make_certs(tmp_path / "other", ca_name="another CA")
    shutil.copytree(other.client, foreign)
    shutil.copy(dind.certs.client / "ca.pem", foreign / "ca.pem")
    stranger = docker_cli({**dind.env, "DOCKER_CERT_PATH": str(foreign)}, "version")
    assert stranger.returncode != 0
    assert "tls: bad certificate" in stranger.stderr, stranger.stderr

    by_name = docker_cli({**dind.env, "DOCKER_HOST": f"tcp://localhost:{dind.port}"}, "version")
    assert by_name.returncode == 0, by_name.stderr  # the server certificate names localhost


def test_buildkit_secret_reaches_the_run_and_nothing_else(
    dind: DindEngine, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    secret = f"dind-secret-{uuid.uuid4().hex}"
    # A build argument is kept in the history and a file in a layer: the search must find it,
    # or finding no secret would prove nothing.
    visible = f"dind-visible-{uuid.uuid4().hex}"
    (tmp_path / "x").write_text(secret)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "FROM envbuild/base:bookworm\n"
        "ARG VISIBLE\n"
        "RUN --mount=type=secret,id=x sha256sum /run/secrets/x | cut -d' ' -f1 > /secret.sha256"
        ' && echo "$VISIBLE" > /visible\n'
    )
    tag = f"envbuild-test/dind-secret:{uuid.uuid4().hex[:12]}"
    built = docker_cli(
        {**dind.env, "DOCKER_BUILDKIT": "1"},
        "build", "--progress=plain", "--secret", f"id=x,src={tmp_path / 'x'}",
        "--build-arg", f"VISIBLE={visible}", "--tag", tag, str(context),
        timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    output = built.stdout + built.stderr
    assert secret not in output

    assert dind.client.images.get(tag)
    with pytest.raises(docker.errors.ImageNotFound):  # built on the dind engine, not the host
        docker_client.images.get(tag)

    # The RUN had the secret: it wrote its hash.
    written = output_of(dind.client, tag, ["cat", "/secret.sha256"]).decode().strip()
    assert written == hashlib.sha256(secret.encode()).hexdigest()

    history = json.dumps(dind.client.images.get(tag).history())
    assert visible in history
    assert secret not in history
    assert secret not in json.dumps(dind.client.images.get(tag).attrs)

    assert [
        f.rsplit(":", 1)[1] for f in needles_in_layers(dind.client, tag, [visible.encode()])
    ] == ["visible"]
    assert needles_in_layers(dind.client, tag, [secret.encode()]) == []


def test_doctor_names_the_dind_engine(dind: DindEngine, tmp_path: Path) -> None:
    version = dind.client.version()["Version"]
    found = envbuild_cli(dind.env, "doctor", "--json", timeout=300)
    assert found.returncode == 0, found.stdout + found.stderr
    engine = json.loads(found.stdout)["engine"]
    assert engine["reachable"] is True
    assert engine["version"] == version
    assert (engine["kind"], engine["address"]) == ("Docker", dind.env["DOCKER_HOST"])
    assert engine["builders"]["buildkit"]["works"] is True  # an empty build, through TLS
    assert "not on this host" in engine["builders"]["classic"]["why_not"]
    assert json.loads(found.stdout)["disk"]["path"] == ""  # not this host's disk

    # The same with a client certificate the engine refuses: doctor went where DOCKER_HOST
    # says (the answer above was the dind engine's), and its line names the address.
    other = make_certs(tmp_path / "other", ca_name="another CA")
    shutil.copy(dind.certs.client / "ca.pem", other.client / "ca.pem")
    refused = envbuild_cli(
        {**dind.env, "DOCKER_CERT_PATH": str(other.client)}, "doctor",
        timeout=300,
    )  # fmt: skip
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "NOT reachable: " in refused.stdout
    assert dind.host in refused.stdout
    assert "Traceback" not in refused.stderr


def test_doctor_reaches_the_dind_engine_with_a_proxy_ca_bundle_set(
    dind: DindEngine, ca_bundle: Path
) -> None:
    """As a user behind a TLS-intercepting proxy runs it: REQUESTS_CA_BUNDLE set for PyPI."""
    proxy_ca = {name: str(ca_bundle) for name in CA_OVERRIDES}
    found = envbuild_cli({**dind.env, **proxy_ca}, "doctor", timeout=300)
    assert found.returncode == 0, found.stdout + found.stderr


def test_torch_cpu_builds_and_passes_its_smoke_test_on_the_dind_engine(
    dind: DindEngine, base_image: str, wheelhouse: Path, ca_bundle: Path, tmp_path: Path
) -> None:
    """The build of the issue's done-when, with BuildKit, on the remote engine: the CA bundle, the
    index password and the wheelhouse reach the install step, and the password nothing else."""
    report = tmp_path / "r.json"
    args = [*torch_cpu_args(base_image, wheelhouse, ca_bundle, report), "--builder", "buildkit"]
    built = envbuild_cli(dind.env, *args)
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-3000:]
    (result,) = json.loads(report.read_text())["results"]
    assert result["status"] == "built"
    assert result["smoke"]["passed"] is True, result["smoke"]
    assert result["smoke"]["versions"]["framework"] == "2.13.0+cpu"
    assert TORCH_CPU_IMAGE in result["image"]["tags"]
    image = dind.client.images.get(result["image"]["id"])  # on the dind engine

    assert SECRET not in output
    assert SECRET not in report.read_text()
    assert SECRET not in json.dumps([image.history(), image.attrs])
    assert needles_in_layers(dind.client, TORCH_CPU_IMAGE, [SECRET.encode()]) == []
