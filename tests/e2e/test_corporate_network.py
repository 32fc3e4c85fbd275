"""Behind a corporate network, for real: a private index that wants a token, an authenticating
proxy, TLS interception with the gateway's own CA and a TLS registry with a password, each a
server in a container (tests/support/corp_network.py). A torch CPU image is locked, built, smoke-tested,
published and verified through them; every secret is then searched for in every output; and
the faults a user meets there (a proxy that dies mid-install, an index that refuses the token,
a registry restarted mid-push, a registry certificate from an unknown CA) end cleanly."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from tests.support.corp_network import (
    INDEX_HOST,
    REGISTRY_USER,
    SLOW_PROXY_USER,
    CorpNetwork,
    corp_network,
)
from tests.support.docker_support import REPO, envbuild, needles_in_layers, output_of
from tests.support.fault_support import run_containers

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

ENTRY = "torch2.13.0-cpu-py3.11-bookworm"
REPOSITORY = "envbuild-test/corp-{framework}"
KILLED_IMAGE = "envbuild-test/corp-killed-torch:2.13.0-cpu-py3.11-bookworm"
TEAM_MATRIX = """\
description: the team's torch CPU image, built behind the corporate network
defaults:
  python: "3.11"
  os: bookworm
  numpy: false  # an image no other test builds: its content hash is new, so it is built
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""


@dataclass
class Team:
    """A user behind the corporate network: their folder, environment and what they ran."""

    corp: CorpNetwork
    folder: Path
    base_image: str
    runs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    @property
    def matrix(self) -> Path:
        return self.folder / "team.yaml"

    @property
    def env(self) -> dict[str, str]:
        """The registry is inside the network (NO_PROXY); its password is in Docker's config."""
        return {
            "XDG_CACHE_HOME": str(self.folder / "cache"),
            "ENVBUILD_DATA_DIR": str(self.folder / "data"),
            "DOCKER_CONFIG": str(self.folder / "docker"),
            "GITHUB_STEP_SUMMARY": str(self.folder / "summary.md"),
            "NO_PROXY": self.corp.registry_host.split(":")[0],
            "no_proxy": "",
            "HTTPS_PROXY": "",
            "https_proxy": "",
            "HTTP_PROXY": "",
            "http_proxy": "",
        }

    def fetch(self, *, token: str | None = None, proxy: str | None = None) -> list[str]:
        """Where packages come from: the private index (no framework index), through the
        proxy, trusting the gateway's CA."""
        corp = self.corp
        index = corp.index_url if token is None else corp.index_url.replace(corp.index_token, token)
        return [
            "--index-url", index, "--framework-index", "none",
            "--proxy", proxy or corp.proxy_url, "--ca-bundle", str(corp.ca_bundle),
        ]  # fmt: skip

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        result = envbuild(*args, env=self.env, timeout=1200)
        self.runs[name] = result
        return result

    def build(self, name: str, *args: str, **fetch: str) -> subprocess.CompletedProcess[str]:
        return self.run(
            name, "build", "-m", str(self.matrix), "--locked", *self.fetch(**fetch),
            "--base-image", self.base_image, *args,
        )  # fmt: skip


@pytest.fixture(scope="module")
def corp(
    docker_client: docker.DockerClient, ca_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CorpNetwork]:
    """The servers, and Docker's engine told to trust the registry's CA (certs.d)."""
    folder = tmp_path_factory.mktemp("corp")
    with corp_network(docker_client, folder, REPO / "wheelhouse", ca_bundle) as network:
        certs = Path("/etc/docker/certs.d") / network.registry_host
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(network.ca_bundle, certs / "ca.crt")
        try:
            yield network
        finally:
            shutil.rmtree(certs, ignore_errors=True)


@pytest.fixture(scope="module")
def team(corp: CorpNetwork, base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Team:
    """Lock, build (+ smoke test) with --push, then verify: the issue's commands, once."""
    folder = tmp_path_factory.mktemp("team")
    user = Team(corp=corp, folder=folder, base_image=base_image)
    user.matrix.write_text(TEAM_MATRIX)
    (folder / "docker").mkdir()
    auth = base64.b64encode(f"{REGISTRY_USER}:{corp.registry_password}".encode()).decode()
    (folder / "docker" / "config.json").write_text(
        json.dumps({"auths": {corp.registry_host: {"auth": auth}}})
    )
    user.run("lock", "lock", "-m", str(user.matrix), *user.fetch())
    user.build(
        "build", "--repository", REPOSITORY, "--push", f"{corp.registry_host}/ml",
        "--report", str(folder / "report.json"), "--junit", str(folder / "junit.xml"),
    )  # fmt: skip
    immutable = re.search(r"^\s*immutable\s+(\S+)\s", user.runs["build"].stdout, re.MULTILINE)
    if immutable is not None:
        user.run("verify", "verify", immutable[1], "--ca-bundle", str(corp.ca_bundle))
    return user


def forget_team_image(team: Team, docker_client: docker.DockerClient) -> None:
    """Remove the image the team built, so that a build of the same content runs again (the
    fault tests come after the tests that publish it)."""
    report = json.loads((team.folder / "report.json").read_text())
    image_id = report["results"][0]["image"]["id"]
    with contextlib.suppress(docker.errors.NotFound):
        docker_client.images.remove(image_id, force=True)


def start_until(
    team: Team, args: list[str], reached: Callable[[], bool], timeout: float = 300
) -> subprocess.Popen[str]:
    """Start `envbuild ARGS` as the team and return once `reached()` (or the command ended)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "envbuild", *args], env={**os.environ, **team.env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None and not reached():
        time.sleep(0.1)
    return process


def uploading(registry_log: str, repository: str) -> bool:
    """The registry has opened an upload of a new blob into `repository` (a POST that is not a
    cross-repository mount): the engine streams its data next."""
    return any(
        "http.request.method=POST" in line
        and f"/v2/{repository}/blobs/uploads/" in line
        and "mount=" not in line
        for line in registry_log.splitlines()
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The error line of a failed command (stderr's last line)."""
    return one_line_of(result.stderr)


def one_line_of(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    return lines[-1]


def test_a_locked_image_is_built_smoke_tested_published_and_verified_through_the_network(
    team: Team, corp: CorpNetwork, docker_client: docker.DockerClient
) -> None:
    for name in ("lock", "build", "verify"):
        assert name in team.runs, f"{name} did not run: {team.runs.get('build')}"
        result = team.runs[name]
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
    assert (team.folder / "team.lock" / f"{ENTRY}.txt").is_file()
    report = json.loads((team.folder / "report.json").read_text())
    (entry,) = report["results"]
    assert entry["passed"] is True, entry
    assert entry["smoke"]["passed"] is True, entry["smoke"]
    assert "smoke report of image" in team.runs["verify"].stdout
    assert ": passed" in team.runs["verify"].stdout
    # Its lock (numpy: false, no packages) is the framework's closure alone: nothing is installed
    # above the framework image, and the image keeps the lock in the venv and no installer.
    lock = (team.folder / "team.lock" / f"{ENTRY}.txt").read_text()
    kept = output_of(
        docker_client, entry["entry"]["image"],
        ["sh", "-c", "ls -A /; echo ===; cat /opt/venv/envbuild.lock"], network_mode="none",
    ).decode()  # fmt: skip
    top, _, kept_lock = kept.partition("===\n")
    assert kept_lock == lock
    assert not {"install_env.py", "framework.lock", "envbuild.lock", "cuda.lock"} & set(top.split())
    log = next((team.folder / "cache" / "envbuild" / "logs").rglob(f"{ENTRY}.log")).read_text()
    assert "RUN rm -f /install_env.py /framework.lock" in log
    assert "/opt/venv /envbuild.lock" not in log  # no installer ran for the team's part
    # The routes were the network's: uv on this host and the build's RUN step reached the index
    # through squid (as the proxy's user) and mitmproxy, which decrypted what they fetched.
    squid = corp.logs("proxy")
    tunnels = re.findall(
        r"^\S+\s+\d+ (\S+) TCP_TUNNEL/200 \d+ CONNECT pypi\.corp:443 builder ", squid, re.M
    )
    gateway = corp.registry_host.split(":")[0]
    assert gateway in tunnels, "uv on the host (envbuild lock) did not use the proxy"
    assert any(ip != gateway for ip in tunnels), "the build's RUN step did not use the proxy"
    mitm = corp.logs("mitm")
    assert re.search(r"GET https://pypi\.corp/simple/torch/", mitm), mitm[-2000:]
    assert re.search(r"GET https://pypi\.corp/packages/torch-2\.13\.0\+cpu-", mitm), mitm[-2000:]
    # The registry holds the image under its immutable tag, and served it over TLS with a login.
    registry = corp.logs("registry")
    assert "ml/corp-torch" in registry
    assert f"auth.user.name={REGISTRY_USER}" in registry


def test_no_secret_reaches_a_layer_the_history_a_label_a_log_a_report_or_the_terminal(
    team: Team, corp: CorpNetwork, docker_client: docker.DockerClient
) -> None:
    needles = corp.needles
    assert len(needles) >= 9
    outputs: dict[str, str] = {}
    for name, result in team.runs.items():
        outputs[f"{name} stdout"] = result.stdout
        outputs[f"{name} stderr"] = result.stderr
    files = [p for p in team.folder.rglob("*") if p.is_file() and p.parent.name != "docker"]
    for path in files:  # the lock, report, JUnit, step summary, build logs, the results store
        outputs[str(path.relative_to(team.folder))] = path.read_bytes().decode("latin-1")
    names = {str(p.relative_to(team.folder)) for p in files}
    for wanted in ("report.json", "junit.xml", "summary.md", f"team.lock/{ENTRY}.txt"):
        assert wanted in names, sorted(names)
    assert any(n.startswith("cache/envbuild/logs/") for n in names), sorted(names)
    assert any(n.endswith(".sqlite3") for n in names), sorted(names)
    report = json.loads((team.folder / "report.json").read_text())
    image = docker_client.images.get(report["results"][0]["entry"]["image"])
    outputs["image history"] = json.dumps(image.history())
    outputs["image config and labels"] = json.dumps(image.attrs)
    leaked = [
        (where, what) for where, text in outputs.items() for what, n in needles.items() if n in text
    ]
    assert leaked == []
    layers = needles_in_layers(docker_client, image.id, [n.encode() for n in needles.values()])
    assert layers == []
    # The searches can fail: the password is in Docker's config, which envbuild only reads.
    config = (team.folder / "docker" / "config.json").read_text()
    assert base64.b64encode(f"{REGISTRY_USER}:{corp.registry_password}".encode()).decode() in config


def test_a_registry_whose_ca_is_unknown_is_refused_with_the_fix(
    team: Team, corp: CorpNetwork
) -> None:
    image = json.loads((team.folder / "report.json").read_text())["results"][0]["entry"]["image"]
    registry = f"{corp.registry_host}/unknown-ca"
    # envbuild's own client, without --ca-bundle: the default store does not know the corp CA.
    refused = team.run("publish-no-ca", "publish", image, "--registry", registry)
    assert refused.returncode != 0
    line = one_line(refused)
    assert "TLS" in line, line
    assert "--ca-bundle" in line, line
    assert "certs.d" in line, line
    # Docker's engine, without certs.d for the registry: the push is refused with the fix.
    certs = Path("/etc/docker/certs.d") / corp.registry_host / "ca.crt"
    saved = certs.read_bytes()
    certs.unlink()
    try:
        engine_refused = team.run(
            "publish-no-certs.d", "publish", image, "--registry", registry,
            "--ca-bundle", str(corp.ca_bundle),
        )  # fmt: skip
    finally:
        certs.write_bytes(saved)
    assert engine_refused.returncode != 0
    line = one_line(engine_refused)
    assert f"/etc/docker/certs.d/{corp.registry_host}/ca.crt" in line, line
    assert "Traceback" not in refused.stderr + engine_refused.stderr


def test_an_index_that_refuses_the_token_fails_in_one_line_naming_the_index(
    team: Team, corp: CorpNetwork, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    wrong = "tok-wrong-" + "0" * 16
    locked = team.folder / "team.lock"
    shutil.copytree(team.folder, tmp_path / "copy", ignore=shutil.ignore_patterns("cache", "data"))
    relock = envbuild(
        "lock", "-m", str(tmp_path / "copy" / "team.yaml"), "--upgrade",
        *team.fetch(token=wrong), env=team.env, timeout=300,
    )  # fmt: skip
    assert relock.returncode != 0
    line = one_line(relock)
    assert INDEX_HOST in line, line
    assert "401" in line or "403" in line or "credentials" in line, line
    forget_team_image(team, docker_client)
    before = {i.id for i in docker_client.images.list(name="envbuild-test/corp-refused-torch")}
    build = envbuild(
        "build", "-m", str(team.matrix), "--locked", *team.fetch(token=wrong),
        "--base-image", team.base_image, "--repository", "envbuild-test/corp-refused-{framework}",
        "--no-smoke", "--no-cache", env=team.env, timeout=600,  # its framework image too
    )  # fmt: skip
    assert build.returncode == 1, build.stderr[-2000:]
    failure = [line for line in build.stderr.splitlines() if line.startswith("FAILED ")]
    assert len(failure) == 1, build.stderr[-3000:]
    assert INDEX_HOST in failure[0], failure[0]
    assert "401" in failure[0] or "403" in failure[0] or "credentials" in failure[0], failure[0]
    for result in (relock, build):
        text = result.stdout + result.stderr
        assert wrong not in text
        assert corp.index_token not in text
        assert corp.proxy_password not in text
        assert "Traceback" not in text
    assert {
        i.id for i in docker_client.images.list(name="envbuild-test/corp-refused-torch")
    } == before
    assert locked.is_dir()


def test_the_proxy_killed_mid_install_fails_the_build_cleanly_and_the_rerun_builds(
    team: Team, corp: CorpNetwork, docker_client: docker.DockerClient
) -> None:
    repository = "envbuild-test/corp-killed-{framework}"
    args = [
        "build", "-m", str(team.matrix), "--locked", *team.fetch(proxy=corp.proxy_as(SLOW_PROXY_USER)),
        "--base-image", team.base_image, "--repository", repository, "--no-smoke",
        "--no-cache",  # its framework image too: the install that downloads torch runs again
    ]  # fmt: skip
    forget_team_image(team, docker_client)
    log = team.folder / "cache" / "envbuild" / "logs" / f"{ENTRY}.log"
    log.unlink(missing_ok=True)
    process = start_until(
        team, args, lambda: log.is_file() and "Downloading torch" in log.read_text(errors="replace")
    )
    assert process.poll() is None, "the build ended before its install downloaded torch"
    corp.kill_proxy()
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        corp.restart_proxy()
    assert process.returncode == 1, stderr[-3000:]
    failure = [line for line in stderr.splitlines() if line.startswith("FAILED ")]
    assert len(failure) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    assert corp.proxy_password not in stdout + stderr
    assert docker_client.images.list(name="envbuild-test/corp-killed-torch") == [], (
        "a failed build tagged"
    )
    assert run_containers(docker_client, process.pid, log) == []  # its install step's included
    rerun = team.build("rerun", "--repository", repository)  # smoke-tested: published below
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    docker_client.images.get(KILLED_IMAGE)


def test_the_registry_restarted_mid_push_leaves_a_clean_state_and_publishing_again_verifies(
    team: Team, corp: CorpNetwork
) -> None:
    # The image of the rerun above: its install layer is new to the registry (the base's layers
    # are mounted from the team's repository), so the restart cuts a real upload.
    image = KILLED_IMAGE
    registry = f"{corp.registry_host}/restarted"
    args = ["publish", image, "--registry", registry, "--ca-bundle", str(corp.ca_bundle)]
    process = start_until(
        team, args, lambda: uploading(corp.logs("registry"), "restarted/corp-killed-torch")
    )
    assert process.poll() is None, "the publish ended before a layer was uploaded"
    corp.restart_registry()
    stdout, stderr = process.communicate(timeout=900)
    assert "Traceback" not in stderr
    assert corp.registry_password not in stdout + stderr
    if process.returncode != 0:
        # Failed: one line, and nothing recorded as published; publishing again succeeds.
        assert one_line_of(stderr).startswith("envbuild: error: "), stderr[-3000:]
        assert len([x for x in stderr.splitlines() if x.startswith("envbuild: error")]) == 1
        again = team.run("publish-again", *args)
        assert again.returncode == 0, again.stderr[-3000:]
        stdout = again.stdout
    immutable = re.search(r"^\s*immutable\s+(\S+)\s", stdout, re.MULTILINE)
    assert immutable is not None, stdout
    verified = team.run(
        "verify-restarted", "verify", immutable[1], "--ca-bundle", str(corp.ca_bundle)
    )
    assert verified.returncode == 0, verified.stderr[-3000:]
