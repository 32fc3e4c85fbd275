"""Framework images on a real engine and a real registry (issue 24): two teams' entries that share
a framework key build its image once and stand on the same layers; `--push` publishes it beside
their images; an engine with neither the image nor a record of it takes it from the registry; and
an image under the right tag that is not the key's (pushed by hand) is refused and rebuilt."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import docker
import pytest
import requests

from tests.support.docker_support import TEST_INDEX, TEST_LABEL, envbuild
from tests.support.registry_server import RegistryServer

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

ENTRY = "torch2.13.0-cpu-py3.11-bookworm"
MATRIX = """\
defaults:
  python: "3.11"
  os: bookworm
  # root: a framework key of this test's own (the user is made in its first RUN), which it
  # can take from the engine without taking the other lane's torch CPU framework image.
  user: root
  repository: "envbuild-test/fw-{name}-{{framework}}"
  packages: [{packages}]
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""
TEAMS = {
    "a": '"six==1.16.0"',
    "b": '"tqdm"',
    "bumped": '"six==1.17.0"',
    "c": '"six==1.16.0", "tqdm"',
}
ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
))  # fmt: skip


def layers(server: RegistryServer, reference: str) -> list[str]:
    """The layer digests of the manifest `reference` (host/repository:tag) names."""
    repository, _, tag = reference.removeprefix(f"{server.host}/").rpartition(":")
    answer = requests.get(
        f"{server.url}/v2/{repository}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10
    )
    answer.raise_for_status()
    return [layer["digest"] for layer in answer.json()["layers"]]


def immutable(done: subprocess.CompletedProcess[str]) -> str:
    """The immutable reference `build --push` published the entry's image under."""
    found = re.search(r"^\s*immutable (\S+) sha256:", done.stdout, re.MULTILINE)
    assert found, done.stdout
    return found.group(1)


def forget_local(
    docker_client: docker.DockerClient, registry: str = "", framework: str = ""
) -> None:
    """Untag every image of this test (`envbuild-test/fw-*`, its framework image's tag
    `framework`, and what it pushed to `registry`): the engine holds them no more, as a node
    that never did. By tag, never by id."""
    for image in docker_client.images.list():
        for tag in image.tags:
            if (
                tag.startswith("envbuild-test/fw-")
                or (framework and tag == f"envbuild/framework:{framework}")
                or (registry and tag.startswith(registry))
            ):
                try:
                    docker_client.images.remove(tag)
                except docker.errors.APIError as exc:  # a child of it is another lane's
                    print(f"could not remove {tag}: {exc}")


def test_teams_share_one_framework_image_found_by_key_here_and_in_the_registry(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    given = ["--base-image", base_image, "--wheelhouse", str(wheelhouse),
             "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX]  # fmt: skip
    paths = {}
    for name, packages in TEAMS.items():
        folder = tmp_path / name
        folder.mkdir()
        paths[name] = folder / "team.yaml"
        paths[name].write_text(MATRIX.format(name=name, packages=packages))
        locked = envbuild("lock", "-m", str(paths[name]), *given)
        assert locked.returncode == 0, locked.stderr[-3000:]

    def envbuild_as(state: str, *args: str) -> subprocess.CompletedProcess[str]:
        """envbuild `args` with the store and cache of `state` (one machine each), succeeding."""
        done = envbuild(
            *args, *given, "--builder", "classic",
            env={"XDG_CACHE_HOME": str(tmp_path / state / "cache"),
                 "ENVBUILD_DATA_DIR": str(tmp_path / state / "data")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    def build(name: str, state: str) -> subprocess.CompletedProcess[str]:
        """`build --push` of team `name`'s entry on machine `state`."""
        return envbuild_as(state, "build", "-m", str(paths[name]), "--locked", "--push", registry)

    def planned(name: str, state: str) -> str:
        """What `plan --frameworks --registry` says of team `name`'s framework image."""
        plan = ("plan", "-m", str(paths[name]), "--frameworks", "--registry", registry)
        done = envbuild_as(state, *plan)
        said = [line for line in done.stdout.splitlines() if line.startswith(f"  {ENTRY}: ")]
        assert len(said) == 1, done.stdout
        return said[0]

    forget_local(docker_client)
    try:
        with RegistryServer(tmp_path / "registry") as server:
            registry = f"{server.host}/teams"
            before = planned("a", "one")
            assert before.endswith(f": not on this engine; not in {registry}"), before
            # Team A: its framework image is built, and pushed beside its image.
            first = build("a", "one")
            assert re.search(
                r"framework torch 2\.13\.0\+cpu \(key [0-9a-f]{12}\): built in", first.stderr
            )
            pushed = re.search(
                rf"framework ({re.escape(registry)}/framework:(\S+)) (sha256:[0-9a-f]{{64}})",
                first.stdout,
            )
            assert pushed, first.stdout
            remote, framework_tag, digest = pushed.groups()
            framework = layers(server, remote)
            local = docker_client.images.get(f"envbuild/framework:{framework_tag}")
            key = local.labels["org.envbuild.framework-key"]
            assert framework_tag.endswith(key[:32])
            assert layers(server, immutable(first))[: len(framework)] == framework
            # The plan names its key, and that it is built here and published (by digest).
            assert planned("b", "one") == (
                f"  {ENTRY}: torch 2.13.0+cpu, key {key[:12]}: built on this engine; "
                f"published as {remote}@{digest}"
            )
            # Team B, other packages, the same framework: found here by its key, not built.
            second = build("b", "one")
            assert "): built before on this engine" in second.stderr
            team_b = layers(server, immutable(second))
            assert team_b[: len(framework)] == framework
            assert len(team_b) == len(framework) + 2  # the lock's COPY, the team's packages

            # An engine and a store that hold neither the framework image nor a record of it:
            # A's bump takes it from the registry, checks it and stands on it.
            forget_local(docker_client, server.host, framework_tag)
            assert planned("bumped", "two").endswith(
                f": not on this engine; published as {remote}@{digest}"
            )
            bumped = build("bumped", "two")
            assert f"): from the registry as {remote}, its distributions checked" in bumped.stderr
            assert layers(server, immutable(bumped))[: len(framework)] == framework

            # A framework image pushed by hand under the right tag, with the key's label but
            # not its distributions, is refused in one line and built again, never used.
            forget_local(docker_client, server.host, framework_tag)
            docker_client.images.build(
                fileobj=io.BytesIO(
                    f'FROM {base_image}\nLABEL org.envbuild.framework-key="{key}" '
                    f'{TEST_LABEL}="1"\n'.encode()
                ),
                tag=remote,
                rm=True,
            )
            for line in docker_client.images.push(remote, stream=True, decode=True):
                assert "error" not in line, line
            docker_client.images.remove(remote)  # its own tag: the image is this test's
            refused = build("c", "three")
            said = [line for line in refused.stderr.splitlines() if f"{remote} refused (" in line]
            assert said, refused.stderr[-3000:]
            # Warned as it happens, and said in the entry's progress: why, and that it was built.
            assert all("listing its distributions failed: it did not start" in s for s in said)
            assert any(line.endswith(" s") and "; built in " in line for line in said), said
            assert layers(server, remote) == framework  # put right
    finally:
        forget_local(docker_client)
