"""The proxy through the real engine: Docker's predefined proxy arguments reach the RUN steps,
but the proxy's password is in no layer, no history entry, no label or env of the image, and the
proxy is not part of the cache key. No proxy server is needed: the RUN step only hashes the
variable it sees."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import docker
import pytest

from envbuild.core.models import ProxySettings
from envbuild.engine.interface import Engine
from tests.support.docker_support import TEST_LABEL

SECRET = "Pr0xy-integration-pa55"
URL = f"http://proxy-user:{SECRET}@proxy.corp.invalid:3128"
SECRET_FORMS = (SECRET.encode(), quote(SECRET, safe="").encode())


def dockerfile(base_image: str) -> str:
    return (
        f"FROM {base_image}\n"
        # The step prints and keeps only a hash of what it saw: the test can match it.
        'RUN printf "%s" "$HTTPS_PROXY" | sha256sum | cut -d" " -f1 > /proxy.sha256 '
        '&& echo "proxy-hash=$(cat /proxy.sha256) no_proxy=$no_proxy"\n'
    )


def build(
    engine: Engine, folder: Path, base_image: str, settings: ProxySettings
) -> tuple[str, list[str]]:
    (folder / "Dockerfile").write_text(dockerfile(base_image), encoding="utf-8")
    lines: list[str] = []
    image_id = engine.build(
        folder, tag=None, labels={TEST_LABEL: "proxy"}, build_args={}, on_line=lines.append,
        proxy=settings,
    )  # fmt: skip
    return image_id, lines


@pytest.fixture
def image_ids(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for image_id in dict.fromkeys(made):
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.images.remove(image_id, force=True)


def test_the_proxy_reaches_the_run_step_and_no_part_of_the_image(
    engine: Engine,
    docker_client: docker.DockerClient,
    base_image: str,
    tmp_path: Path,
    image_ids: list[str],
) -> None:
    settings = ProxySettings(http=URL, https=URL, no_proxy=("pypi.corp", "172.17.0.1"))
    image_id, lines = build(engine, tmp_path, base_image, settings)
    image_ids.append(image_id)

    seen = hashlib.sha256(URL.encode()).hexdigest()
    assert f"proxy-hash={seen} no_proxy=pypi.corp,172.17.0.1" in "\n".join(lines)
    assert not any(SECRET in line for line in lines)

    history = json.dumps(docker_client.api.history(image_id)).encode()
    config = json.dumps(docker_client.api.inspect_image(image_id)).encode()
    assert b"proxy.corp.invalid" not in history  # not even the host: the whole value is left out
    for form in SECRET_FORMS:
        assert form not in history
        assert form not in config
    saved = b"".join(docker_client.images.get(image_id).save(named=False))
    assert saved, "docker save returned nothing"
    for form in SECRET_FORMS:
        assert form not in saved  # no layer tarball, config or manifest holds it


def test_another_proxy_password_is_a_cache_hit(
    engine: Engine, base_image: str, tmp_path: Path, image_ids: list[str]
) -> None:
    first, _ = build(engine, tmp_path, base_image, ProxySettings(http=URL, https=URL))
    image_ids.append(first)
    other = URL.replace(SECRET, "another-password")
    second, lines = build(engine, tmp_path, base_image, ProxySettings(http=other, https=other))
    image_ids.append(second)
    assert second == first
    assert any("Using cache" in line for line in lines)
