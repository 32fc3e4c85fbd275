"""The engine boundary: unreachable engines, base probing, bad bases, images that are not torch."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from pathlib import Path

import docker
import pytest
import requests

from envbuild.core import labels as label_keys
from envbuild.core.errors import EnvbuildError
from envbuild.core.interrupt import RUN_LABEL, RUN_PLACE_LABEL, run_id, run_place
from envbuild.engine import probe_records
from envbuild.engine.docker_engine import RUN_OUTPUT_MAX, DockerEngine
from envbuild.engine.interface import Engine
from tests.support.docker_support import TEST_LABEL, derive, envbuild
from tests.support.registry_server import RegistryServer


def test_an_unreachable_engine_exits_3_without_a_traceback() -> None:
    result = envbuild(
        "build", "--framework-version", "2.13.0", "--cuda", "cpu",
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )  # fmt: skip
    assert result.returncode == 3
    assert "cannot reach the Docker engine" in result.stderr
    assert "Traceback" not in result.stderr


def test_probe_reads_os_and_python(engine: Engine, base_image: str) -> None:
    probe = engine.probe_base(base_image)
    assert (probe.os_id, probe.os_codename, probe.python) == ("debian", "bookworm", None)
    assert probe.image_id.startswith("sha256:")


def test_a_probe_is_recorded_by_image_id_and_read_back_instead_of_running_a_container(
    engine: Engine, base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = engine.probe_base(base_image)
    path = probe_records.record_path(first.image_id)
    assert path is not None
    record = json.loads(path.read_text())
    found = {key: record[key] for key in ("os_id", "os_codename", "python")}
    assert found == {"os_id": "debian", "os_codename": "bookworm", "python": None}
    # What the record says is what the next probe answers: no container looked again.
    record["os_codename"] = "recorded"
    path.write_text(json.dumps(record))
    second = engine.probe_base(base_image)
    assert (second.os_codename, second.image_id) == ("recorded", first.image_id)
    # A record that is not one is probed again, and written over.
    path.write_text("{not json")
    third = engine.probe_base(base_image)
    assert third == first
    assert json.loads(path.read_text())["os_codename"] == "bookworm"


def test_a_base_whose_python_cannot_match_is_refused_before_building(base_image: str) -> None:
    result = envbuild(
        "build", "--framework-version", "2.13.0", "--cuda", "cpu", "--python", "3.12",
        "--base-image", base_image, "--repository", "envbuild-test/{framework}",
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        "bookworm provides Python 3.11, but torch2.13.0-cpu-py3.12-bookworm needs 3.12"
        in result.stderr
    )
    assert "Step 1" not in result.stderr


def test_a_missing_base_image_is_named(docker_client: object) -> None:
    result = envbuild(
        "build", "--framework-version", "2.13.0", "--cuda", "cpu",
        "--base-image", "envbuild-test/no-such-base:1",
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        "base image envbuild-test/no-such-base:1 is not in the local engine and cannot be pulled"
        in result.stderr
    )


def test_smoke_of_an_image_envbuild_did_not_build_is_refused(base_image: str) -> None:
    # No framework label: smoke refuses it as bench does (one payload runner, issue 22).
    result = envbuild("smoke", base_image, "--timeout", "60")
    assert result.returncode == 2
    assert "org.envbuild.framework label" in result.stderr
    assert "Traceback" not in result.stderr


def test_smoke_of_an_image_without_torch_fails(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    # Labelled torch, but the bare base has neither Python nor torch: the payload leaves no report.
    tag = derive(
        docker_client, tmp_path, "envbuild-test/labelled-without-torch:1",
        f"FROM {base_image}\nLABEL {label_keys.FRAMEWORK}=torch\n", {},
    )  # fmt: skip
    result = envbuild("smoke", tag, "--timeout", "60")
    assert result.returncode == 1
    assert "without a JSON report" in result.stdout


def test_smoke_of_a_missing_image_is_bad_input(docker_client: object) -> None:
    result = envbuild("smoke", "envbuild-test/absent:nope")
    assert result.returncode == 2
    assert "is not in the local engine" in result.stderr


def test_doctor_on_a_host_without_gpus_reports_it_plainly(docker_client: object) -> None:
    import json

    result = envbuild("doctor", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["engine"]["reachable"] is True
    assert report["engine"]["version"]
    assert report["has_gpu"] is False
    assert report["nvidia"]["gpus"] == []
    assert "no NVIDIA GPU found" in report["nvidia"]["note"]
    assert report["disk"]["free_bytes"] > 0
    assert "torch2.13.0-cpu-py3.11-bookworm" in report["runnable"]
    assert all(not entry.startswith("torch2.13.0-cu") for entry in report["runnable"])


def test_doctor_without_an_engine_exits_3_and_still_reports() -> None:
    import json

    result = envbuild("doctor", "--json", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert report["engine"]["reachable"] is False
    assert "cannot reach the Docker engine" in report["engine"]["error"]


MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class _RacedEngine(DockerEngine):
    """A real engine whose first `vanish` tags are dropped at once, as a second publisher of the
    same image does when it finishes between this one's tag and push."""

    def __init__(self, client: docker.DockerClient, vanish: int) -> None:
        super().__init__(client)
        self.vanish = vanish
        self.tags = 0

    def tag(self, image_id: str, ref: str) -> None:
        super().tag(image_id, ref)
        self.tags += 1
        if self.tags <= self.vanish:
            self._client.images.remove(ref, noprune=True)


def test_a_push_whose_tag_another_publisher_dropped_tags_again(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    image = str(docker_client.images.get(base_image).id)
    with RegistryServer(tmp_path / "registry") as server:
        ref = f"{server.host}/raced/base:one"
        engine = _RacedEngine(docker_client, vanish=1)
        digest = engine.push(image, ref, auth_config=None, on_line=lambda _: None)
        assert engine.tags == 2
        assert digest.startswith("sha256:")
        manifest = requests.head(
            f"{server.url}/v2/raced/base/manifests/one",
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
            timeout=10,
        )
        assert manifest.headers["Docker-Content-Digest"] == digest
    assert ref not in docker_client.images.get(image).tags  # the local tag is dropped after


def test_a_push_whose_tag_keeps_vanishing_stops_with_one_line(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    image = str(docker_client.images.get(base_image).id)
    with RegistryServer(tmp_path / "registry") as server:
        ref = f"{server.host}/raced/base:always"
        engine = _RacedEngine(docker_client, vanish=100)
        with pytest.raises(EnvbuildError, match="local tag was removed 4 times") as caught:
            engine.push(image, ref, auth_config=None, on_line=lambda _: None)
        assert "\n" not in str(caught.value)
        assert engine.tags == 4


def test_a_stopped_container_another_run_still_needs_is_not_removed_as_a_leftover(
    docker_client: docker.DockerClient, engine: Engine, base_image: str
) -> None:
    """Two envbuild runs on one engine (parallel CI jobs on one runner): a run's clean-up of
    what dead runs left must not take a container that another, live run has just stopped and
    is still reading (smoke) or committing (the install step, its run's build server still up).
    What the engine killed, a failed install step, one whose build server is gone and the smoke
    container of a run that is gone are a dead run's."""
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    smoke = {TEST_LABEL: "1", "org.envbuild.role": "smoke"}
    dead_run = {**smoke, RUN_LABEL: f"{reaped.pid}-0badc0de", RUN_PLACE_LABEL: run_place()}
    live_run = {**smoke, RUN_LABEL: run_id(), RUN_PLACE_LABEL: run_place()}
    install = {TEST_LABEL: "1", "org.envbuild.stage": "install"}
    # An install step's run serves its build (ENVBUILD_SERVE) until the build is over.
    server = socket.create_server(("127.0.0.1", 0))
    with socket.create_server(("127.0.0.1", 0)) as closed:
        over = closed.getsockname()[1]
    serving = {"ENVBUILD_SERVE": f"http://127.0.0.1:{server.getsockname()[1]}/t/"}
    made = {
        "live run's smoke": (live_run, "true", 0, {}),
        "committing": (install, "true", 0, serving),
        "dead run's smoke": (dead_run, "true", 0, {}),
        "failed step": (install, "false", 1, serving),
        "killed": (smoke, "sleep 600", 137, {}),  # as the engine does to what ran when it died
        "build over": (install, "true", 0, {"ENVBUILD_SERVE": f"http://127.0.0.1:{over}/t/"}),
    }
    containers = {
        name: docker_client.containers.run(
            base_image, command.split(), detach=True, labels=labels, environment=env
        )
        for name, (labels, command, _, env) in made.items()
    }
    try:
        containers["killed"].kill()
        for name, container in containers.items():
            assert container.wait(timeout=60)["StatusCode"] == made[name][2], name
        engine.remove_leftovers()
        kept = {
            c.id for c in docker_client.containers.list(all=True, filters={"label": TEST_LABEL})
        }
        assert {name for name, c in containers.items() if c.id in kept} == {
            "live run's smoke",
            "committing",
        }
    finally:
        server.close()
        for container in containers.values():
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_what_a_container_prints_is_kept_up_to_a_bound(engine: Engine, base_image: str) -> None:
    """`run` serves images envbuild did not build too (a framework image pushed by hand): an
    output without end is cut at RUN_OUTPUT_MAX, said so, and the run still ends."""
    result = engine.run(
        base_image, ["sh", "-c", f"head -c {RUN_OUTPUT_MAX + 4 * 1024 * 1024} /dev/zero; echo done >&2"],
        timeout=60,
    )  # fmt: skip
    assert result.exit_code == 0
    note = f"\n[envbuild: output cut at {RUN_OUTPUT_MAX} bytes]\n"
    assert result.stdout == "\0" * RUN_OUTPUT_MAX + note
    assert result.stderr == "done\n"


def test_a_client_two_engines_wrap_still_reads_what_a_container_prints(
    docker_client: docker.DockerClient, base_image: str
) -> None:
    """Each DockerEngine wraps its docker-py client's requests; the tests (and a caller) may make
    two of one client: the log answer is read once, by the innermost, and handed on whole."""
    DockerEngine(docker_client)
    outer = DockerEngine(docker_client)
    result = outer.run(base_image, ["sh", "-c", "echo out; echo err >&2"], timeout=60)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    frames = docker_client.containers.run(base_image, ["echo", "plain"], detach=True)
    try:
        frames.wait(timeout=60)
        assert frames.logs() == b"plain\n"
    finally:
        frames.remove(force=True)


@pytest.mark.parametrize("quoted", [False, True], ids=["one-instruction", "through-the-api"])
def test_a_classic_build_labels_the_image_exactly_in_one_step(
    docker_client: docker.DockerClient,
    engine: Engine,
    base_image: str,
    tmp_path: Path,
    quoted: bool,
) -> None:
    """The classic builder's labels are one LABEL instruction added to the Dockerfile sent
    (a step each through its API): the image has exactly the labels given, words the builder
    would expand or unquote kept as they are. One that cannot be written so (a quote) goes
    through the API, with the same result."""
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nENV NAME=value\nRUN true\n")
    labels = {
        TEST_LABEL: "1",
        "org.example.expanded": "$NAME ${NAME:-x} $HOME",
        "org.example.spaced": ' a  b "c" \\d = e ',
        "org.example.empty": "",
        "org.example.quote": "it's" if quoted else "its",
    }
    image_id = engine.build(
        tmp_path, tag=None, labels=labels, build_args={}, on_line=lambda _: None
    )
    try:
        image = docker_client.images.get(image_id)
        own = {name: value for name, value in image.labels.items() if name in labels}
        assert own == labels
        # The history, newest first: what the build added after its RUN.
        after_run = []
        for step in image.history():
            if "true" in str(step["CreatedBy"]):
                break
            after_run.append(str(step["CreatedBy"]))
        assert len([step for step in after_run if "LABEL" in step]) == (
            len(labels) if quoted else 1
        )
        assert [path.name for path in tmp_path.iterdir()] == ["Dockerfile"]
    finally:
        docker_client.images.remove(image_id, force=True)
