"""The registry client against a real registry (Debian's docker-registry), no Docker engine.

Covers references, pushing and reading back manifests and blobs (cross-checked with skopeo),
evidence artifacts through the referrers tag schema, htpasswd (Basic) and token (Bearer)
authentication with credentials from Docker's config, env vars and a credential helper, and
the errors a user meets: no or wrong credentials, a stopped registry, unknown names.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from envbuild.core.errors import EXIT_FAILED, BadInput, EnvbuildError
from envbuild.net.credentials import (
    PASSWORD_ENV,
    USERNAME_ENV,
    Credentials,
    docker_auth_config,
    lookup_credentials,
)
from envbuild.publish.evidence import attach_evidence, find_evidence, referrers_tag
from envbuild.registry import (
    EVIDENCE_ARTIFACT_TYPE,
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE_ANNOTATION,
    EvidenceNotFound,
    RegistryAuthError,
    RegistryClient,
    RegistryNotFound,
    RegistryRef,
    RegistryUnreachable,
    default_scheme,
    parse_reference,
)
from tests.support.registry_server import RegistryServer, push_image, sha256

USER = "envbuild-ci"
PASSWORD = "pa55-registry-Z3cret"  # searched for in every message and log record
WRONG_PASSWORD = "not-the-pa55-Wr0ng"


class RecordingSession(requests.Session):
    """A real session that remembers which requests went out."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((str(method), str(url)))
        return super().request(method, url, *args, **kwargs)


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Neither the host's ~/.docker nor ENVBUILD_REGISTRY_* may leak into a test."""
    monkeypatch.delenv(USERNAME_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    config_dir = tmp_path / "docker-config"
    config_dir.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    return config_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def basic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path_factory.mktemp("registry-htpasswd"), users={USER: PASSWORD}) as s:
        yield s


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    directory = tmp_path_factory.mktemp("registry-token")
    with RegistryServer(directory, users={USER: PASSWORD}, token_auth=True) as s:
        yield s


def write_docker_config(config_dir: Path, host: str, user: str, password: str) -> None:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


EVIDENCE = {
    "smoke.json": (b'{"passed": true, "loss": [2.3, 0.4]}', "application/json"),
    "packages.txt": (b"torch==2.4.1\nnumpy==2.0.2\n", "text/plain"),
}


# -- references -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "127.0.0.1:5055/x/torch:tag",
            RegistryRef(host="127.0.0.1:5055", repository="x/torch", tag="tag"),
        ),
        (
            "registry.example.com/team/ml/torch",
            RegistryRef(host="registry.example.com", repository="team/ml/torch", tag="latest"),
        ),
        (
            "localhost:5000/torch@sha256:" + "a" * 64,
            RegistryRef(host="localhost:5000", repository="torch", digest="sha256:" + "a" * 64),
        ),
        (
            "[::1]:5000/a/b:2.4.1-cu121@sha256:" + "b" * 64,
            RegistryRef(
                host="[::1]:5000", repository="a/b", tag="2.4.1-cu121", digest="sha256:" + "b" * 64
            ),
        ),
    ],
)
def test_parse_reference_splits_host_repository_and_reference(
    text: str, expected: RegistryRef
) -> None:
    ref = parse_reference(text)
    assert ref == expected
    assert ref.reference == (expected.digest or expected.tag)


@pytest.mark.parametrize("text", ["torch:2.4", "team/torch:2.4", "library/ubuntu"])
def test_a_reference_without_a_registry_host_is_refused_clearly(text: str) -> None:
    with pytest.raises(BadInput, match="names no registry host") as caught:
        parse_reference(text)
    assert "Docker Hub shorthand is not supported" in caught.value.message


@pytest.mark.parametrize(
    "text",
    ["127.0.0.1:5000/Torch:1", "127.0.0.1:5000/torch:bad/tag@x", "127.0.0.1:5000/t@sha256:1"],
)
def test_a_malformed_reference_is_refused(text: str) -> None:
    with pytest.raises(BadInput, match="image reference"):
        parse_reference(text)


@pytest.mark.parametrize(
    ("host", "scheme"),
    [
        ("127.0.0.1:5000", "http"),
        ("127.1.2.3", "http"),
        ("localhost:5000", "http"),
        ("[::1]:5000", "http"),
        ("registry.example.com", "https"),
        ("10.0.0.5:5000", "https"),
    ],
)
def test_loopback_registries_use_http_like_docker(host: str, scheme: str) -> None:
    assert default_scheme(host) == scheme
    assert RegistryClient(host, credentials=None).base_url == f"{scheme}://{host}"


# -- manifests and blobs -------------------------------------------------------------


def test_a_pushed_manifest_reads_back_with_the_sha256_of_its_bytes(server: RegistryServer) -> None:
    client = RegistryClient(server.host, credentials=None)
    digest, _ = push_image(client, "envbuild-test/torch", "v1")

    assert client.manifest_digest("envbuild-test/torch", "v1") == digest
    assert client.manifest_digest("envbuild-test/torch", digest) == digest
    manifest, media_type, got_digest = client.get_manifest("envbuild-test/torch", "v1")
    assert (media_type, got_digest) == (OCI_MANIFEST, digest)
    assert manifest["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"

    skopeo = shutil.which("skopeo")
    assert skopeo, "skopeo is not installed; run `apt-get install -y skopeo`"
    result = subprocess.run(
        [skopeo, "inspect", "--tls-verify=false", f"docker://{server.host}/envbuild-test/torch:v1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["Digest"] == digest


def test_blobs_round_trip_and_known_blobs_are_not_uploaded_again(server: RegistryServer) -> None:
    session = RecordingSession()
    client = RegistryClient(server.host, credentials=None, session=session)
    data = b"a blob that exists once " + str(time.time_ns()).encode()

    descriptor = client.push_blob("envbuild-test/blobs", data, "application/octet-stream")
    assert descriptor == {
        "mediaType": "application/octet-stream",
        "digest": sha256(data),
        "size": len(data),
    }
    assert [m for m, _ in session.sent] == ["HEAD", "POST", "PUT"]

    session.sent.clear()
    assert client.push_blob("envbuild-test/blobs", data, "application/octet-stream") == descriptor
    assert [m for m, _ in session.sent] == ["HEAD"]
    assert client.get_blob("envbuild-test/blobs", descriptor["digest"]) == data


def test_an_unknown_repository_or_tag_is_named(server: RegistryServer) -> None:
    client = RegistryClient(server.host, credentials=None)
    with pytest.raises(RegistryNotFound) as caught:
        client.manifest_digest("envbuild-test/no-such-repo", "v1")
    assert f"{server.host}/envbuild-test/no-such-repo:v1" in caught.value.message
    assert caught.value.exit_code == EXIT_FAILED

    push_image(client, "envbuild-test/tags", "exists")
    with pytest.raises(RegistryNotFound, match=r"envbuild-test/tags:missing does not exist"):
        client.get_manifest("envbuild-test/tags", "missing")
    with pytest.raises(RegistryNotFound, match="no such blob"):
        client.get_blob("envbuild-test/tags", "sha256:" + "0" * 64)


def test_a_stopped_registry_fails_after_retries_in_bounded_time(tmp_path: Path) -> None:
    stopped = RegistryServer(tmp_path / "stopped")
    client = RegistryClient(stopped.host, credentials=None)
    push_image(client, "envbuild-test/gone", "v1")
    stopped.close()

    start = time.monotonic()
    with pytest.raises(RegistryUnreachable) as caught:
        client.manifest_digest("envbuild-test/gone", "v1")
    assert time.monotonic() - start < 15
    assert caught.value.message.startswith(f"cannot reach registry {stopped.host}")
    assert "after 4 tries (Connection refused)" in caught.value.message
    assert "\n" not in caught.value.message


def test_delete_manifest_is_best_effort(server: RegistryServer) -> None:
    client = RegistryClient(server.host, credentials=None)
    digest, _ = push_image(client, "envbuild-test/delete", "v1")
    assert client.delete_manifest("envbuild-test/delete", digest) is True
    with pytest.raises(RegistryNotFound):
        client.manifest_digest("envbuild-test/delete", digest)
    assert client.delete_manifest("envbuild-test/delete", digest) is False


# -- evidence -------------------------------------------------------------------------


def test_evidence_is_found_again_through_the_referrers_tag_schema(server: RegistryServer) -> None:
    client = RegistryClient(server.host, credentials=None)
    repository = "envbuild-test/evidence"
    subject, size = push_image(client, repository, "v1")

    # distribution 2.8 has no referrers API: the route is a plain-text 404.
    assert client.referrers(repository, subject) is None

    first = attach_evidence(client, repository, subject, OCI_MANIFEST, size, EVIDENCE)
    index, media_type, _ = client.get_manifest(repository, referrers_tag(subject))
    assert referrers_tag(subject) == "sha256-" + subject.removeprefix("sha256:")
    assert media_type == OCI_INDEX
    assert [(d["digest"], d["artifactType"]) for d in index["manifests"]] == [
        (first, EVIDENCE_ARTIFACT_TYPE)
    ]
    artifact, artifact_type, _ = client.get_manifest(repository, first)
    assert artifact_type == OCI_MANIFEST
    assert artifact["artifactType"] == EVIDENCE_ARTIFACT_TYPE
    assert artifact["subject"] == {"mediaType": OCI_MANIFEST, "digest": subject, "size": size}
    assert artifact["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert {layer["annotations"][TITLE_ANNOTATION] for layer in artifact["layers"]} == set(EVIDENCE)

    assert find_evidence(client, repository, subject) == {k: v[0] for k, v in EVIDENCE.items()}

    newer = {"smoke.json": (b'{"passed": true, "rerun": 2}', "application/json")}
    second = attach_evidence(client, repository, subject, OCI_MANIFEST, size, newer)
    index, _, _ = client.get_manifest(repository, referrers_tag(subject))
    assert [d["digest"] for d in index["manifests"]] == [first, second]
    assert find_evidence(client, repository, subject) == {"smoke.json": newer["smoke.json"][0]}
    # The image itself is untouched.
    assert client.manifest_digest(repository, "v1") == subject


def test_an_image_without_evidence_is_a_clear_error(server: RegistryServer) -> None:
    client = RegistryClient(server.host, credentials=None)
    subject, _ = push_image(client, "envbuild-test/bare", "v1")
    with pytest.raises(EvidenceNotFound) as caught:
        find_evidence(client, "envbuild-test/bare", subject)
    message = caught.value.message
    assert (
        f"no envbuild evidence is attached to {server.host}/envbuild-test/bare@{subject}" in message
    )
    assert referrers_tag(subject) in message


# -- credentials and auth -------------------------------------------------------------


def test_credentials_come_from_docker_config_and_work(
    basic_server: RegistryServer, no_ambient_credentials: Path
) -> None:
    write_docker_config(no_ambient_credentials, basic_server.host, USER, PASSWORD)
    credentials = lookup_credentials(basic_server.host)
    assert credentials is not None
    assert (credentials.username, credentials.source) == (
        USER,
        str(no_ambient_credentials / "config.json"),
    )
    assert docker_auth_config(basic_server.host) == {
        "username": USER,
        "password": PASSWORD,
        "serveraddress": basic_server.host,
    }
    assert lookup_credentials("127.0.0.1:1") is None

    client = RegistryClient.for_host(basic_server.host)
    subject, size = push_image(client, "envbuild-test/private", "v1")
    assert client.manifest_digest("envbuild-test/private", "v1") == subject
    attach_evidence(client, "envbuild-test/private", subject, OCI_MANIFEST, size, EVIDENCE)
    assert (
        find_evidence(client, "envbuild-test/private", subject)["smoke.json"]
        == (EVIDENCE["smoke.json"][0])
    )


def test_without_credentials_a_protected_registry_is_one_clear_line(
    basic_server: RegistryServer,
) -> None:
    assert lookup_credentials(basic_server.host) is None
    client = RegistryClient.for_host(basic_server.host)
    with pytest.raises(RegistryAuthError) as caught:
        client.manifest_digest("envbuild-test/private", "v1")
    error = caught.value
    assert isinstance(error, EnvbuildError)
    assert error.exit_code == EXIT_FAILED
    assert error.message.startswith(f"registry {basic_server.host} requires authentication")
    assert f"docker login {basic_server.host}" in error.message
    assert f"set {USERNAME_ENV} and {PASSWORD_ENV}" in error.message
    assert "\n" not in error.message


def test_a_wrong_password_is_refused_without_showing_it(
    basic_server: RegistryServer,
    no_ambient_credentials: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    write_docker_config(no_ambient_credentials, basic_server.host, USER, WRONG_PASSWORD)
    client = RegistryClient.for_host(basic_server.host)
    with pytest.raises(RegistryAuthError) as caught:
        push_image(client, "envbuild-test/private", "wrong")
    message = caught.value.message
    assert message.startswith(f"registry {basic_server.host} rejected the credentials from ")
    assert f"docker login {basic_server.host}" in message
    shown = [message, str(caught.value), repr(caught.value), repr(client), caplog.text]
    shown.append(repr(lookup_credentials(basic_server.host)))
    assert not [text for text in shown if WRONG_PASSWORD in text]
    encoded = base64.b64encode(f"{USER}:{WRONG_PASSWORD}".encode()).decode()
    assert not [text for text in shown if encoded in text]


def test_environment_credentials_win_over_docker_config(
    basic_server: RegistryServer,
    no_ambient_credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_docker_config(no_ambient_credentials, basic_server.host, USER, WRONG_PASSWORD)
    monkeypatch.setenv(USERNAME_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    credentials = lookup_credentials(basic_server.host)
    assert credentials == Credentials(
        username=USER, password=PASSWORD, source=f"{USERNAME_ENV}/{PASSWORD_ENV}"
    )
    assert PASSWORD not in repr(credentials)
    client = RegistryClient.for_host(basic_server.host)
    digest, _ = push_image(client, "envbuild-test/private", "env")
    assert client.manifest_digest("envbuild-test/private", "env") == digest

    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(BadInput, match=f"{USERNAME_ENV} is set but {PASSWORD_ENV} is not"):
        lookup_credentials(basic_server.host)


def test_a_docker_credential_helper_is_asked_with_the_host_on_stdin(
    basic_server: RegistryServer,
    no_ambient_credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-envbuildtest"
    secret = json.dumps({"ServerURL": basic_server.host, "Username": USER, "Secret": PASSWORD})
    helper.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 2\n'
        "read -r host\n"
        f'if [ "$host" = "{basic_server.host}" ]; then\n'
        f"  printf '%s' '{secret}'\n"
        "else\n"
        "  echo 'credentials not found in native keychain'; exit 1\n"
        "fi\n"
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    config = {"auths": {}, "credHelpers": {basic_server.host: "envbuildtest"}}
    (no_ambient_credentials / "config.json").write_text(json.dumps(config))

    credentials = lookup_credentials(basic_server.host)
    assert credentials is not None
    assert (credentials.username, credentials.source) == (USER, "docker-credential-envbuildtest")
    client = RegistryClient(basic_server.host, credentials=credentials)
    digest, _ = push_image(client, "envbuild-test/private", "helper")
    assert client.manifest_digest("envbuild-test/private", "helper") == digest

    # A global credsStore that has nothing for a host means: no credentials.
    (no_ambient_credentials / "config.json").write_text(json.dumps({"credsStore": "envbuildtest"}))
    assert lookup_credentials("127.0.0.1:1") is None


def test_bearer_token_auth_gets_pull_and_push_tokens_from_the_realm(
    token_server: RegistryServer, no_ambient_credentials: Path
) -> None:
    write_docker_config(no_ambient_credentials, token_server.host, USER, PASSWORD)
    client = RegistryClient.for_host(token_server.host)
    subject, size = push_image(client, "envbuild-test/tokens", "v1")
    assert client.manifest_digest("envbuild-test/tokens", "v1") == subject
    attach_evidence(client, "envbuild-test/tokens", subject, OCI_MANIFEST, size, EVIDENCE)
    assert set(find_evidence(client, "envbuild-test/tokens", subject)) == set(EVIDENCE)

    assert token_server.token_server is not None
    asked = token_server.token_server.requests
    assert {r["user"] for r in asked} == {USER}
    granted = [set(scope.rpartition(":")[2].split(",")) for r in asked for scope in r["scopes"]]
    assert {"pull", "push"} in granted
    # Tokens are reused: far fewer token requests than registry requests.
    assert len(asked) <= 4


def test_bearer_token_auth_without_or_with_wrong_credentials_is_one_clear_line(
    token_server: RegistryServer, no_ambient_credentials: Path
) -> None:
    anonymous = RegistryClient.for_host(token_server.host)
    with pytest.raises(RegistryAuthError) as caught:
        anonymous.manifest_digest("envbuild-test/tokens", "v1")
    assert caught.value.message.startswith(f"registry {token_server.host} requires authentication")

    write_docker_config(no_ambient_credentials, token_server.host, USER, WRONG_PASSWORD)
    wrong = RegistryClient.for_host(token_server.host)
    with pytest.raises(RegistryAuthError) as caught:
        wrong.manifest_digest("envbuild-test/tokens", "v1")
    assert caught.value.message.startswith(f"registry {token_server.host} rejected the credentials")
    assert WRONG_PASSWORD not in caught.value.message
    assert "\n" not in caught.value.message
