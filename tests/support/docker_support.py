"""Fixtures for the tiers that use a real Docker engine (integration, e2e).

Nothing here skips: a missing engine, base image or wheel fails the run with the fix to apply.
Every image the tests make is tagged under TEST_REPOSITORY or labelled TEST_LABEL and removed at
the end of the session (and leftovers of an interrupted session at its start).

The tiers may run in two lanes on one engine (pytest-xdist, `-n 2 --dist loadfile`, a module
per lane at a time; scripts/test.sh does): what a whole session makes once (the torch CPU image,
the CPU matrix, the results store) is then made once for both lanes, under a file lock in
`shared_root`, and the engine is cleaned when the first lane starts and the last one ends.
Tests marked `alone` (they kill the engine, or measure) run after the lanes, by themselves:
ENVBUILD_TEST_SHARED names the folder the two runs share, and ENVBUILD_TEST_KEEP_IMAGES=1 keeps
the lanes' images for that second run.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
import yaml

from envbuild.core.errors import EngineUnavailable
from envbuild.core.models import Lock
from envbuild.engine.interface import Engine, connect
from tests.support.registry_server import RegistryServer

REPO = Path(__file__).resolve().parents[2]
TEST_REPOSITORY = "envbuild-test/{framework}"
TEST_LABEL = "org.envbuild.test"
DEFAULT_BASE = "envbuild/base:bookworm"
# Credentials in the index URL: PyPI ignores them, and the tests check none reach the image.
SECRET = "s3cret-envbuild-test"
TEST_INDEX = f"https://envbuild-test:{SECRET}@pypi.org/simple"


def envbuild(
    *args: str, env: dict[str, str] | None = None, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Run the installed CLI as a user would, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def output_of(
    docker_client: docker.DockerClient, image: str, command: list[str], **options: object
) -> bytes:
    """What `command` prints on stdout in a fresh container of `image` (docker-py's
    `containers.run` options), the container removed whatever happens; ContainerError with its
    stderr on a non-zero exit, as `containers.run` raises.

    Not `containers.run(..., remove=True)`: it reads the log stream only after it removed the
    container, and a short-lived container's stream may be closed by then (docker-py then fails
    inside its own code with "'NoneType' object has no attribute 'raw'")."""
    container = docker_client.containers.create(image, command, **options)
    try:
        container.start()
        status = container.wait(timeout=600)["StatusCode"]
        if status != 0:
            stderr = container.logs(stdout=False, stderr=True)
            raise docker.errors.ContainerError(container, status, command, image, stderr)
        return bytes(container.logs(stdout=True, stderr=False))
    finally:
        container.remove(force=True)


def derive(
    docker_client: docker.DockerClient,
    folder: Path,
    tag: str,
    dockerfile: str,
    files: dict[str, str],
) -> str:
    """Build a derived image (a sabotaged copy of a tested one) from `dockerfile` in `folder`,
    labelled TEST_LABEL so that the session removes it."""
    (folder / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (folder / name).write_text(text)
    docker_client.images.build(path=str(folder), tag=tag, labels={TEST_LABEL: "1"}, rm=True)
    return tag


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every lane of this test run shares (see the module's docstring)."""
    given = os.environ.get("ENVBUILD_TEST_SHARED")
    if given:
        path = Path(given)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent  # xdist: <basetemp>/popen-gwN per worker
    else:
        path = tmp_path_factory.getbasetemp()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (made if missing) across processes."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once(
    root: Path, name: str, run: Callable[[], subprocess.CompletedProcess[str]]
) -> subprocess.CompletedProcess[str]:
    """`run()` (a CLI run) once for every lane of the test run: the first lane runs it (the
    others wait) and keeps what it printed and its exit code in `root`; the others read that."""
    done = root / f"once-{name}.json"
    with locked(root / f"once-{name}.lock"):
        if not done.is_file():
            result = run()
            kept = [result.args, result.returncode, result.stdout, result.stderr]
            done.write_text(json.dumps(kept))
    args, code, stdout, stderr = json.loads(done.read_text())
    return subprocess.CompletedProcess(args, code, stdout, stderr)


def _read_count(path: Path) -> int:
    return int(path.read_text() or 0) if path.is_file() else 0


def _remove_test_images(client: docker.DockerClient) -> None:
    # The tests' framework images too (envbuild/framework, one name on an engine for every key).
    ours = ("envbuild-test/", "envbuild/framework:")
    for image in client.images.list():
        if any(tag.startswith(ours) for tag in image.tags):
            for tag in image.tags:
                if tag.startswith(ours):
                    client.images.remove(tag, force=True)
    for image in client.images.list(filters={"label": TEST_LABEL}):
        try:
            client.images.remove(image.id, force=True)
        except docker.errors.APIError as exc:  # in use by another test session's container
            print(f"could not remove test image {image.short_id}: {exc}")
    # A push leaves the image referenced by its digest in the test registry (127.0.0.1:PORT/...)
    # after its tags are gone; such an image would stay on the shared disk.
    for image in client.images.list():
        references = [*image.tags, *(image.attrs.get("RepoDigests") or [])]
        if references and all(r.startswith(("127.0.0.1:", "localhost:")) for r in references):
            try:
                client.images.remove(image.id, force=True)
            except docker.errors.APIError as exc:
                print(f"could not remove test image {image.short_id}: {exc}")
    client.images.prune(filters={"dangling": True, "label": "org.envbuild.stage=builder"})
    client.images.prune(filters={"dangling": True, "label": "org.envbuild.stage=install"})
    client.images.prune(filters={"dangling": True, "label": "org.envbuild.stage=framework"})


@pytest.fixture(scope="session", autouse=True)
def isolated_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Smoke and publish records of the tests go to a throwaway store, not the user's."""
    path = shared_root(tmp_path_factory) / "envbuild-data"  # both lanes: they share records
    path.mkdir(exist_ok=True)
    before = os.environ.get("ENVBUILD_DATA_DIR")
    os.environ["ENVBUILD_DATA_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("ENVBUILD_DATA_DIR", None)
    else:
        os.environ["ENVBUILD_DATA_DIR"] = before


@pytest.fixture(scope="session")
def docker_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[docker.DockerClient]:
    """The engine, cleaned of test images when the first lane starts and the last one ends."""
    try:
        connect()
    except EngineUnavailable as exc:
        pytest.fail(f"{exc.message} (these tests need a real engine; .ci/run starts one)")
    client = docker.from_env(timeout=600)
    root = shared_root(tmp_path_factory)
    users, cleaned = root / "engine-users", root / "engine-cleaned"
    with locked(root / "engine.lock"):
        if not cleaned.exists():
            _remove_test_images(client)
            cleaned.touch()
        users.write_text(str(_read_count(users) + 1))
    yield client
    with locked(root / "engine.lock"):
        left = _read_count(users) - 1
        users.write_text(str(left))
        if left == 0 and os.environ.get("ENVBUILD_TEST_KEEP_IMAGES") != "1":
            _remove_test_images(client)
            for made in root.glob("once-*.json"):  # what they held is gone
                made.unlink()
    client.close()


@pytest.fixture(scope="session")
def engine(docker_client: docker.DockerClient) -> Engine:
    return connect()


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> str:
    ref = os.environ.get("ENVBUILD_TEST_BASE", DEFAULT_BASE)
    try:
        docker_client.images.get(ref)
    except docker.errors.ImageNotFound:
        result = envbuild("base", "bootstrap", "--suite", "bookworm", "--tag", ref)
        assert result.returncode == 0, f"cannot make the base image {ref}: {result.stderr}"
    return ref


@pytest.fixture(scope="session")
def ca_bundle() -> Path:
    path = Path(os.environ.get("ENVBUILD_TEST_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
    assert path.is_file(), f"no CA bundle at {path}; set ENVBUILD_TEST_CA_BUNDLE"
    return path


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only the torch CPU wheel: its dependencies must come from PyPI."""
    source = Path(os.environ.get("ENVBUILD_TEST_WHEELHOUSE", REPO / "wheelhouse"))
    wheels = list(source.glob("torch-2.13.0+cpu-cp311-*.whl"))
    assert wheels, (
        f"no torch 2.13.0 CPU wheel in {source}; run scripts/wheelhouse.sh (or set ENVBUILD_TEST_WHEELHOUSE)"
    )
    root = shared_root(tmp_path_factory)
    path = root / "wheelhouse"  # one for both lanes: the session's builds name it
    with locked(root / "wheelhouse.lock"):
        if not (path / wheels[0].name).is_file():
            path.mkdir(exist_ok=True)
            try:
                (path / wheels[0].name).hardlink_to(wheels[0])
            except OSError:
                shutil.copyfile(wheels[0], path / wheels[0].name)
    return path


def compile_lock(entry_id: str, requirements: str, wheelhouse: Path = REPO / "wheelhouse") -> Lock:
    """A lock for tests, resolved from the wheelhouse alone as `envbuild lock` would (uv)."""
    uv = Path(sys.executable).with_name("uv")
    result = subprocess.run(
        [str(uv), "pip", "compile", "-", "--generate-hashes", "--quiet", "--no-header",
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36",
         "--find-links", str(wheelhouse), "--no-index"],
        input=requirements, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"cannot lock {requirements!r}: {result.stderr}"
    return Lock(entry_id=entry_id, text=result.stdout)


@pytest.fixture(scope="session")
def shared_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """One registry for the tests that only need somewhere to publish, each in its own namespace
    (see `repositories`). The engine compresses and uploads an image's layers the first time
    (~30 s for the torch CPU image here) and mounts them across repositories after (~1.5 s),
    where a registry per test uploads them again. Tests that kill, restart or authenticate the
    registry start their own."""
    with RegistryServer(tmp_path_factory.mktemp("shared-registry")) as server:
        yield server


def repositories(server: RegistryServer, namespace: str) -> list[str]:
    """The registry's repositories under `namespace/`."""
    response = requests.get(f"{server.url}/v2/_catalog", params={"n": 1000}, timeout=10)
    response.raise_for_status()
    found = response.json().get("repositories") or []
    return sorted(r for r in found if r.startswith(f"{namespace}/"))


TORCH_CPU_IMAGE = "envbuild-test/torch:2.13.0-cpu-py3.11-bookworm"


def torch_cpu_args(base_image: str, wheelhouse: Path, ca_bundle: Path, report: Path) -> list[str]:
    """The torch CPU build of the issue's done-when, into the test repository."""
    return [
        "build", "--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
        "--python", "3.11", "--base-image", base_image, "--wheelhouse", str(wheelhouse),
        "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX,
        "--repository", TEST_REPOSITORY, "--report", str(report),
    ]  # fmt: skip


@pytest.fixture(scope="session")
def torch_cpu_build(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, object], list[str]]:
    """Build (and smoke-test) the torch CPU image once per test run: (process, report, args)."""
    root = shared_root(tmp_path_factory)
    (root / "torch-cpu").mkdir(exist_ok=True)
    report = root / "torch-cpu" / "r.json"
    args = torch_cpu_args(base_image, wheelhouse, ca_bundle, report)
    result = once(root, "torch-cpu", lambda: envbuild(*args))
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads(report.read_text()), args


@dataclass(frozen=True, kw_only=True)
class CpuMatrix:
    """The three-entry CPU matrix (torch, TensorFlow, JAX) as built once per session."""

    result: subprocess.CompletedProcess[str]
    report: Path
    junit: Path
    summary: Path

    def images(self) -> dict[str, str]:
        """framework -> the image reference the build tagged."""
        results = json.loads(self.report.read_text())["results"]
        return {r["entry"]["framework"]: r["entry"]["image"] for r in results}


@pytest.fixture(scope="session")
def cpu_matrix(
    base_image: str,
    ca_bundle: Path,
    wheelhouse: Path,
    tmp_path_factory: pytest.TempPathFactory,
    torch_cpu_build: object,  # built first, so its own tests see it built; here it is found
) -> CpuMatrix:
    """Build examples/cpu.yaml two entries at a time (TensorFlow and JAX from PyPI through the CA
    bundle, torch from the wheelhouse), with a JSON report, JUnit and a step summary; once per
    test run. Its JAX include says `user: root`, as a team that needs root would."""
    root = shared_root(tmp_path_factory)
    folder = root / "cpu-matrix"
    report, junit, summary = folder / "r.json", folder / "junit.xml", folder / "summary.md"

    def build() -> subprocess.CompletedProcess[str]:
        folder.mkdir(exist_ok=True)
        matrix = folder / "cpu.yaml"  # a copy: its locks are written beside it, not into the tree
        document = yaml.safe_load((REPO / "matrices" / "examples" / "cpu.yaml").read_text())
        for include in document["include"]:
            if include["framework"] == "jax":
                include["user"] = "root"
        matrix.write_text(yaml.safe_dump(document, sort_keys=False))
        return envbuild(
            "build", "-m", str(matrix), "--jobs", "2", "--keep-going",
            "--base-image", base_image, "--ca-bundle", str(ca_bundle),
            "--wheelhouse", str(wheelhouse), "--index-url", TEST_INDEX,
            "--repository", TEST_REPOSITORY, "--report", str(report), "--junit", str(junit),
            env={"GITHUB_STEP_SUMMARY": str(summary)},
        )  # fmt: skip

    result = once(root, "cpu-matrix", build)
    return CpuMatrix(result=result, report=report, junit=junit, summary=summary)


def needles_in_layers(
    docker_client: docker.DockerClient, image: str, needles: list[bytes]
) -> list[str]:
    """Every (layer member, needle) where a needle occurs in a file's name or contents.

    Read as the engine streams the saved image, never written to disk (an image of gigabytes
    on a disk the tests fill would fail for want of space, not for a leak). Every layer the
    archive's manifest names must have been read: Docker's `<id>/layer.tar`, Podman's
    `<digest>.tar` (its `<id>/layer.tar` are links to them)."""
    found: list[str] = []
    longest = max(len(n) for n in needles)
    stream = _ChunkStream(docker_client.images.get(image).save(named=False))
    read: set[str] = set()
    links: dict[str, str] = {}
    manifest = None
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for layer in outer:
            if layer.name == "manifest.json":
                extracted = outer.extractfile(layer)
                assert extracted is not None
                manifest = json.load(extracted)
            elif layer.issym() or layer.islnk():
                links[layer.name] = posixpath.normpath(
                    posixpath.join(posixpath.dirname(layer.name), layer.linkname)
                    if layer.issym() else layer.linkname
                )  # fmt: skip
            elif layer.isfile() and layer.name.endswith(".tar"):
                read.add(layer.name)
                extracted = outer.extractfile(layer)
                assert extracted is not None
                with tarfile.open(fileobj=extracted, mode="r|") as inner:
                    for member in inner:
                        if any(n in member.name.encode() for n in needles):
                            found.append(f"{layer.name}:{member.name} (name)")
                        data = inner.extractfile(member) if member.isfile() else None
                        tail = b""
                        while data is not None and (block := data.read(8 * 1024 * 1024)):
                            window = tail + block
                            found += [f"{layer.name}:{member.name}" for n in needles if n in window]
                            tail = window[-longest:]
    assert manifest is not None, f"the saved {image} has no manifest.json"
    names = [name for image_manifest in manifest for name in image_manifest["Layers"]]
    assert names, f"the saved {image} names no layers"
    unread = [name for name in names if links.get(name, name) not in read]
    assert unread == [], f"layers of the saved {image} not read: {unread}"
    return found


class _ChunkStream(io.RawIOBase):
    """The chunks of an engine's stream as a file read front to back."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n
