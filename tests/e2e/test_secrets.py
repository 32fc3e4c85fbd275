"""Nothing secret leaves envbuild: not through its output (a failing build with debug logging,
every output searched), nor into the one-stage image (every layer, the history, the config)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import secrets
import socket
import struct
import time
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.build.entry import build_entry, prepare
from envbuild.build.render import check_options
from envbuild.core.labels import LOCK_DIGEST
from envbuild.core.models import BUILDKIT, CLASSIC, BuildOptions, Knowledge, Lock, Selection
from envbuild.core.redact import register_url
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine
from envbuild.knowledge.load import load_knowledge
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from tests.support.docker_support import (
    compile_lock,
    derive,
    envbuild,
    needles_in_layers,
    output_of,
    torch_cpu_args,
)
from tests.support.fault_support import epoch
from tests.support.lock_support import fresh_lock, the_entry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def python_base(
    docker_client: docker.DockerClient, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The bare base with Debian's python3, as `base bootstrap --with-python` makes one."""
    apt = "apt-get install -y --no-install-recommends python3 python3-venv python3-pip-whl"
    return derive(
        docker_client, tmp_path_factory.mktemp("python-base"), "envbuild-test/base:python",
        f"FROM {base_image}\nRUN apt-get update && {apt} && rm -rf /var/lib/apt/lists/*\n", {},
    )  # fmt: skip


@pytest.mark.parametrize("builder", [CLASSIC, BUILDKIT])
def test_no_output_of_a_failed_build_holds_the_index_password(
    builder: str,
    docker_client: docker.DockerClient,
    torch_cpu_build: object,
    python_base: str,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    password = f"Pw-{secrets.token_hex(8)}"
    extra_password = f"Xp-{secrets.token_hex(8)}"
    needles = [password, extra_password]
    report, junit, summary = tmp_path / "r.json", tmp_path / "j.xml", tmp_path / "summary.md"
    args = torch_cpu_args(base_image, wheelhouse, ca_bundle, report)
    index = args.index("--index-url")
    repository = args.index("--repository")
    args[repository + 1] = "envbuild-test/secrets-{framework}"
    # --offline, and a lock whose torch hash no wheel has: the install fails at once; the index
    # settings travel only through envbuild's build server or a secret, never in the build's
    # request. An offline build needs a base that brings python3.
    args[index + 1] = f"https://team:{password}@127.0.0.1:9/simple"
    args[args.index("--base-image") + 1] = python_base
    extra = f"https://bot:{extra_password}@127.0.0.1:9/extra"
    args += ["--offline", "--no-smoke", "--junit", str(junit), "--extra-index-url", extra]
    args += ["--builder", builder]
    knowledge = load_knowledge()
    entry = the_entry(
        knowledge, Selection(framework="torch", framework_version="2.13.0", cuda="cpu")
    )
    options = BuildOptions(
        index_url=args[index + 1], extra_index_urls=(extra,), wheelhouse=wheelhouse, offline=True
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        fresh_lock(entry, options, knowledge)  # as `envbuild lock` leaves it, with a wrong hash
    started = time.time()
    result = envbuild(
        "-v", *args,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    # The debug log must show how the build was asked for, for this test to search it.
    asked = "/build?" if builder == CLASSIC else "building with buildkit"
    assert asked in result.stderr
    assert "Traceback" not in result.stderr

    outputs: dict[str, str] = {"stdout": result.stdout, "stderr": result.stderr}
    for path in (report, junit, summary, *(tmp_path / "cache").rglob("*")):
        if path.is_file():
            outputs[str(path)] = path.read_text(errors="replace")
    assert json.loads(report.read_text())["results"][0]["status"] == "failed"
    for image in docker_client.images.list(all=True):
        created = image.attrs.get("Created", "")
        if created and epoch(created) >= started - 5:
            with contextlib.suppress(docker.errors.NotFound):  # the other lane removed its own
                outputs[f"image {image.id}"] = json.dumps([image.history(), image.attrs])
    leaked = [(where, n) for where, text in outputs.items() for n in needles if n in text]
    assert leaked == []
    assert len(outputs) >= 5


# -- the one-stage image: built from a lock, served its CA bundle, index and wheelhouse ---------

SECRET_IMAGE = "envbuild-test/secrets-torch:one-stage-{builder}"


def deflated_chunk(wheel: Path) -> bytes:
    """64 bytes of compressed data from inside the wheel: they exist only in the wheel file."""
    with zipfile.ZipFile(wheel) as archive:
        member = max(
            (i for i in archive.infolist() if i.compress_type == zipfile.ZIP_DEFLATED),
            key=lambda i: i.compress_size,
        )
    with wheel.open("rb") as handle:
        handle.seek(member.header_offset)
        header = handle.read(30)
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        handle.seek(
            member.header_offset + 30 + name_length + extra_length + member.compress_size // 2
        )
        return handle.read(64)


def pins(text: str) -> set[str]:
    """name==version lines, names canonical (pip freeze writes Jinja2, the lock jinja2)."""
    found = set()
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^ \\;]+)", line.strip())
        if match:
            found.add(f"{re.sub(r'[-_.]+', '-', match[1]).lower()}=={match[2]}")
    return found


@pytest.fixture(scope="module", params=[CLASSIC, BUILDKIT])
def one_stage(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    engine: Engine,
    knowledge: Knowledge,
    base_image: str,
    wheelhouse: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """Build the torch CPU image once per builder: torch from a wheelhouse holding it alone, its
    dependencies from PyPI through an index URL with a password, with a CA bundle."""
    builder: str = request.param
    tmp = tmp_path_factory.mktemp("one-stage")
    marker = f"envbuild-ca-marker-{secrets.token_hex(8)}"
    ca = tmp / "ca.pem"  # the host's bundle with a line no image may hold (PEM allows text)
    ca.write_bytes(
        f"# {marker}\n".encode() + Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()
    )
    password = f"Pw-{secrets.token_hex(8)}"
    options = check_options(
        BuildOptions(
            base_image=base_image, wheelhouse=wheelhouse, ca_bundle=ca,
            index_url=f"https://envbuild-test:{password}@pypi.org/simple", builder=builder,
        )
    )  # fmt: skip
    register_url(options.index_url or "")
    selection = Selection(framework="torch", framework_version="2.13.0", cuda="cpu", python="3.11")
    defaults = load_matrix(default_matrix_path(), knowledge)
    (entry,) = make_plan(
        knowledge, knowledge_matrix(knowledge, selection, defaults), selection
    ).entries
    image = SECRET_IMAGE.format(builder=builder)
    entry = dataclasses.replace(entry, image=image)
    lock = compile_lock(entry.id, "torch==2.13.0+cpu\n")
    context = prepare(engine, knowledge, entry, options, None, lock)
    started = time.time()
    built = build_entry(engine, context, store=ResultStore(tmp / "results.sqlite3"), no_cache=True)
    (wheel,) = wheelhouse.glob("torch-*.whl")
    return {
        "built": built, "lock": lock, "started": started, "password": password,
        "image": image, "builder": builder,
        "needles": [marker.encode(), password.encode(), deflated_chunk(wheel)],
    }  # fmt: skip


def test_no_secret_is_in_any_layer_the_history_or_the_config(
    docker_client: docker.DockerClient, one_stage: dict[str, Any]
) -> None:
    needles: list[bytes] = one_stage["needles"]
    assert needles_in_layers(docker_client, one_stage["image"], needles) == []
    image = docker_client.images.get(one_stage["image"])
    described = json.dumps([image.history(), image.attrs]).encode()
    assert [n for n in needles if n in described] == []
    # Nor in any image the build left (the classic builder keeps each step as an image).
    for other in docker_client.images.list(all=True):
        created = other.attrs.get("Created", "")
        if created and epoch(created) >= one_stage["started"] - 5:
            try:
                text = json.dumps([other.history(), other.attrs]).encode()
            except docker.errors.NotFound:  # the other lane removed one of its own meanwhile
                continue
            assert [n for n in needles if n in text] == [], other.id


def test_the_served_url_in_the_history_grants_nothing_after_the_build(
    docker_client: docker.DockerClient, one_stage: dict[str, Any]
) -> None:
    history = json.dumps(docker_client.images.get(one_stage["image"]).history())
    urls = set(re.findall(r"ENVBUILD_SERVE=(http://[^ \"]+)", history))
    if one_stage["builder"] == BUILDKIT:  # nothing is served: the inputs are mounted
        assert urls == set()
        assert "install_env.py --mounted" in history
        return
    (url,) = urls
    parsed = urllib.parse.urlsplit(url)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((parsed.hostname, parsed.port), timeout=5).close()


def test_the_image_holds_its_lock_and_exactly_its_pins(
    docker_client: docker.DockerClient, one_stage: dict[str, Any]
) -> None:
    lock: Lock = one_stage["lock"]
    image = docker_client.images.get(one_stage["image"])
    assert image.labels[LOCK_DIGEST] == lock.digest
    assert image.labels["org.envbuild.stage"] == "image"
    script = (
        "cat /opt/venv/envbuild.lock; echo ----; /opt/venv/bin/pip freeze --all; echo ----; "
        "ls -A /tmp; test -e /opt/venv/bin/uv && echo UV-LEFT; "
        "find / -xdev \\( -name ca.crt -o -name 'torch-*.whl' -o -name 'install_env.py' \\) -print"
    )
    output = output_of(docker_client,
        one_stage["image"], ["sh", "-c", script], network_mode="none",
        user="0:0",  # the whole file system, root's folders included; the image runs as envbuild
    ).decode()  # fmt: skip
    kept, freeze, leftovers = output.split("----\n")
    assert kept == lock.text
    assert pins(freeze) - {p for p in pins(freeze) if p.startswith("pip==")} == pins(lock.text)
    assert leftovers.strip() == ""
