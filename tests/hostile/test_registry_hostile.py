"""The registry client and `envbuild verify` against a hostile registry (tests/support/hostile_registry.py).

Every case is a real HTTP server on 127.0.0.1 that answers one thing badly: links and redirects
to another origin, loops, token realms on plain http, bodies too large or too slow, servers that
never answer, 429/5xx forever, and each malformed JSON shape. The corpus is generated from a
valid published image by mutating one answer. For each case `envbuild -v verify` (a subprocess,
with credentials in ENVBUILD_REGISTRY_USERNAME/PASSWORD) must end with exit 1 (2 for bad
input) and one `envbuild: error:` line, no traceback, the secret nowhere, and no foreign server
may see a credential.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from envbuild.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, EnvbuildError
from envbuild.net.bounded import (
    MAX_PAGES,
    MAX_REDIRECTS,
    is_downgrade,
    printable,
    retry_after_seconds,
    safe_for_credentials,
    same_origin,
)
from envbuild.net.credentials import PASSWORD_ENV, USERNAME_ENV, Credentials
from envbuild.pipeline.frameworks import FrameworkState, published_states
from envbuild.publish.evidence import find_evidence
from envbuild.registry import (
    DEADLINE_ENV,
    RegistryClient,
    RegistryError,
    RegistryMalformed,
    RegistryUnreachable,
)
from tests.support.hostile_registry import (
    EVIDENCE_TYPE,
    OCI_INDEX,
    OCI_MANIFEST,
    REPOSITORY,
    TAG,
    Answer,
    Handler,
    HostileRegistry,
    Published,
    Seen,
    canonical,
    chunked,
    json_answer,
    junk,
    oci_error,
    one_byte_at_a_time,
    require_basic,
    self_signed,
    sha256,
)

ROOT = Path(__file__).resolve().parents[2]
USER = "envbuild-ci"
SECRET = "hostile-Pa55-w0rd-7Qz"  # searched for in every output of every case
SECRETS = (SECRET, base64.b64encode(f"{USER}:{SECRET}".encode()).decode())
CREDENTIALS = Credentials(username=USER, password=SECRET, source="the test")
DEADLINE = "3"  # seconds: ENVBUILD_REGISTRY_TIMEOUT for the CLI cases
MIB = 1024 * 1024
PUBLISHED = Published()
SUBJECT = sha256(PUBLISHED.manifest())
REFERRERS = f"/v2/{REPOSITORY}/referrers/"


# -- running `envbuild verify` -------------------------------------------------------------


def verify(
    host: str,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    json_output: bool = False,
    timeout: float = 90,
) -> subprocess.CompletedProcess[str]:
    """`python -m envbuild -v verify HOST/team/torch:2.4` with the secret in the environment."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in (USERNAME_ENV, PASSWORD_ENV, DEADLINE_ENV) and "proxy" not in k.lower()
    }
    (tmp_path / "docker-config").mkdir(exist_ok=True)
    settings = {
        USERNAME_ENV: USER,
        PASSWORD_ENV: SECRET,
        DEADLINE_ENV: DEADLINE,
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),
        "NO_PROXY": "127.0.0.1,localhost",
        **(env or {}),
    }
    flags = [] if json_output else ["-v"]  # -v: debug logging must not show the secret either
    options = ["--json"] if json_output else []
    argv = ["-m", "envbuild", *flags, "verify", f"{host}/{REPOSITORY}:{TAG}", *options]
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**clean, **settings},
        capture_output=True,
        text=True,
        timeout=timeout,  # a hang guard, not a timing assertion
        check=False,
    )


def error_line(result: subprocess.CompletedProcess[str], code: int = EXIT_FAILED) -> str:
    """The one `envbuild: error:` line of a clean failure (and no secret or traceback)."""
    output = result.stdout + result.stderr
    assert not [s for s in SECRETS if s in output], output
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("envbuild: error:")]
    assert len(errors) == 1, result.stderr
    assert result.returncode == code, result.stderr
    assert "\x1b" not in output
    assert "\r" not in errors[0]
    return errors[0]


def no_credentials_seen(server: HostileRegistry) -> None:
    assert [s.path for s in server.seen if s.authorization] == []


# -- the corpus: a valid image, with one answer broken ---------------------------------------


@dataclass(frozen=True)
class Case:
    """One hostile registry: `serve(foreign)` is its handler, `expect` is in the error line."""

    id: str
    serve: Callable[[HostileRegistry], Handler]
    expect: str | tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[HostileRegistry, HostileRegistry], None] | None = None
    code: int = EXIT_FAILED


def behind_auth(handler: Handler) -> Handler:
    return require_basic(USER, SECRET, handler)


def published(**changes: Any) -> Callable[[HostileRegistry], Handler]:
    content = PUBLISHED.with_(**changes)
    return lambda foreign: behind_auth(content.routes())


def mutated(document: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(document)
    change(data)
    return canonical(data)


def evidence_with(change: Callable[[dict[str, Any]], None]) -> Callable[[HostileRegistry], Handler]:
    """The evidence manifest changed by `change` (and listed under its new digest)."""
    evidence = mutated(PUBLISHED.evidence(), change)
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": sha256(evidence),
                    "artifactType": EVIDENCE_TYPE,
                }
            ],
        }
    )
    return published(evidence_manifest=evidence, referrers_index=index)


def index_with(descriptor: dict[str, Any]) -> Callable[[HostileRegistry], Handler]:
    entry = {"mediaType": OCI_MANIFEST, "artifactType": EVIDENCE_TYPE, **descriptor}
    return published(referrers_index=canonical({"schemaVersion": 2, "manifests": [entry]}))


def manifest_with(change: Callable[[dict[str, Any]], None]) -> Callable[[HostileRegistry], Handler]:
    return published(image_manifest=mutated(PUBLISHED.manifest(), change))


def answering(path: str, answer: Callable[[Seen], Answer]) -> Callable[[HostileRegistry], Handler]:
    """The valid registry, except that requests matching `path` get `answer`."""
    return lambda foreign: behind_auth(PUBLISHED.routes(**{path: answer}))


MANIFEST_PATH = f"/manifests/{TAG}$"
TOKEN_PATH = "^/token"


def setter(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda document: document.__setitem__(key, value)


def layer_setter(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda document: document["layers"][0].__setitem__(key, value)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


MALFORMED_MANIFESTS = {
    "not-json": b"this is not JSON",
    "json-list": b"[]",
    "json-string": b'"manifest"',
    "json-null": b"null",
    "not-utf8": b"\xff\xfe{}",
    "nested-past-the-stack": nested(200_000),
    "huge-number": b'{"schemaVersion": ' + b"9" * 10_000 + b"}",
}
MALFORMED_CONFIGS = {
    "config-string": "sha256:" + "a" * 64,
    "config-list": [],
    "config-digest-int": {"digest": 5},
    "config-digest-junk": {"digest": "not a digest"},
    "config-size-string": {"digest": "sha256:" + "a" * 64, "size": "2"},
    "config-annotations-list": {"digest": "sha256:" + "a" * 64, "annotations": ["x"]},
}
MALFORMED_SMOKE_REPORTS = {
    "smoke-not-json": (b"passed: yes", "not a JSON object"),
    "smoke-not-utf8": (b'{"passed": true, "x": "\xff"}', "not UTF-8"),
    "smoke-list": (b"[]", "not a JSON object"),
    "smoke-string": (b'"passed"', "not a JSON object"),
    "smoke-null": (b"null", "not a JSON object"),
    "smoke-no-image-id": (b'{"passed": true}', "names no image id"),
    "smoke-image-id-int": (b'{"passed": true, "image_id": 7}', "names no image id"),
    "smoke-image-id-none": (b'{"passed": true, "image_id": "None"}', "names no image id"),
    "smoke-passed-string": (
        canonical({"passed": "true", "image_id": PUBLISHED.image_id}),
        "'passed' is not true or false",
    ),
    "smoke-passed-missing": (canonical({"image_id": PUBLISHED.image_id}), "'passed'"),
    "smoke-passed-one": (canonical({"passed": 1, "image_id": PUBLISHED.image_id}), "'passed'"),
}


def _wrong_shapes() -> dict[str, tuple[bytes, str]]:
    """Each section of a passing report given every JSON type but its own (a list where an
    object belongs, ...), and entries of the wrong shape inside the lists and versions."""
    sections = {
        "train": {}, "allreduce": {}, "versions": {}, "compile": {}, "loader": {},
        "checkpoint": {}, "numpy": {}, "packages": {}, "cuda_static": {}, "devices": [],
        "errors": [], "checks": [], "image": "x", "ok": True, "seconds": 1.5,
    }  # fmt: skip
    values: list[Any] = [[], {}, "x", 7, 1.5, True, None, [{"loss_first": 2.3}]]
    cases = {}
    for key, good in sections.items():
        for value in values:
            fits = type(value) is type(good) or (key == "seconds" and type(value) is int)
            if fits:
                continue
            body = canonical({"passed": True, "image_id": PUBLISHED.image_id, key: value})
            cases[f"smoke-{key}-{type(value).__name__}"] = (body, f"its '{key}' is")
    inside = {
        "checks-item-string": ({"checks": ["payload"]}, "its checks[0] is not"),
        "checks-passed-string": (
            {"checks": [{"name": "x", "passed": "yes", "detail": ""}]}, "its checks[0] is not"
        ),
        "versions-number": ({"versions": {"python": 3.11}}, "its versions.python is a number"),
        "versions-object": ({"versions": {"cuda": {"x": 1}}}, "its versions.cuda is an object"),
        "errors-objects": ({"errors": [{"e": 1}]}, "its errors are not all strings"),
        "devices-strings": ({"devices": ["cpu"]}, "its devices are not all objects"),
    }  # fmt: skip
    for name, (extra, why) in inside.items():
        body = canonical({"passed": True, "image_id": PUBLISHED.image_id, **extra})
        cases[f"smoke-{name}"] = (body, why)
    return cases


MALFORMED_SMOKE_REPORTS.update(_wrong_shapes())
MALFORMED_EVIDENCE = {
    "evidence-layers-string": (setter("layers", "smoke-report.json"), "layers is not a list"),
    "evidence-layer-string": (setter("layers", ["x"]), "not a JSON object"),
    "evidence-layer-size-missing": (
        lambda d: d["layers"][0].pop("size"),
        "a layer has no size",
    ),
    "evidence-layer-size-negative": (layer_setter("size", -1), "size is not a byte count"),
    "evidence-layer-size-string": (layer_setter("size", "143"), "size is not a byte count"),
    "evidence-layer-size-bool": (layer_setter("size", True), "size is not a byte count"),
    "evidence-layer-digest-int": (layer_setter("digest", 1), "digest is not a digest"),
    "evidence-layer-annotations-list": (layer_setter("annotations", ["t"]), "annotations"),
    "evidence-layer-title-int": (
        layer_setter("annotations", {"org.opencontainers.image.title": 3}),
        "annotations",
    ),
    "evidence-annotations-list": (setter("annotations", ["x"]), "annotations is not an object"),
    "evidence-too-many-files": (
        lambda d: d.__setitem__("layers", d["layers"] * 9),
        "more than 16 files",
    ),
    "evidence-layer-smaller-than-its-blob": (layer_setter("size", 10), "sent more than 10 bytes"),
    "evidence-layer-larger-than-the-cap": (layer_setter("size", 65 * MIB), "more than 64 MiB"),
    "evidence-without-smoke-report": (
        lambda d: d.__setitem__("layers", d["layers"][1:]),
        "holds no smoke-report.json",
    ),
}
MALFORMED_DESCRIPTORS = {
    "index-digest-int": {"digest": 1},
    "index-digest-junk": {"digest": "../../etc/passwd"},
    "index-artifact-type-int": {"digest": "sha256:" + "b" * 64, "artifactType": 1},
    "index-annotations-list": {"digest": "sha256:" + "b" * 64, "annotations": []},
    "index-annotation-int": {"digest": "sha256:" + "b" * 64, "annotations": {"a": 1}},
    "index-size-negative": {"digest": "sha256:" + "b" * 64, "size": -5},
}
# One tag for several platforms: an image index where one image belongs.
_CHILD = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "d" * 64, "size": 10}
_ARM64 = {"os": "linux", "architecture": "arm64"}
MALFORMED_PLATFORM_INDEXES = {
    "platform-index-empty": ([], "does not list 1 to 8 images"),
    "platform-index-of-nine": ([{**_CHILD, "platform": _ARM64}] * 9, "does not list 1 to 8 images"),
    "platform-index-child-string": (["sha256:" + "d" * 64], "a descriptor is not a JSON object"),
    "platform-index-child-junk-digest": ([{**_CHILD, "digest": "../x", "platform": _ARM64}],
                                         "a descriptor's digest is not a digest"),
    "platform-index-child-unnamed": ([_CHILD], "an image's platform is not named"),
    "platform-index-child-platform-ints": ([{**_CHILD, "platform": {"os": 1, "architecture": 2}}],
                                           "an image's platform is not named"),
    "platform-index-child-platform-list": ([{**_CHILD, "platform": ["linux", "arm64"]}],
                                           "an image's platform is not named"),
}  # fmt: skip
MALFORMED_INDEXES = {
    "index-not-json": b"<html>referrers</html>",
    "index-list": b"[]",
    "index-manifests-dict": canonical({"schemaVersion": 2, "manifests": {}}),
    "index-manifest-string": canonical({"schemaVersion": 2, "manifests": ["sha256:x"]}),
}


def token_realm(
    realm: str, token_answer: Callable[[Seen], Answer]
) -> Callable[[HostileRegistry], Handler]:
    """A registry that wants bearer tokens from `realm` ("{self}" is its own URL)."""

    def serve(foreign: HostileRegistry) -> Handler:
        inner = PUBLISHED.routes()

        def handle(seen: Seen) -> Answer:
            if seen.path.startswith("/token"):
                return token_answer(seen)
            if not (seen.authorization or "").startswith("Bearer "):
                where = realm.replace("{self}", seen.headers["Host"])
                challenge = f'Bearer realm="{where}",service="hostile"'
                return Answer(status=401, headers={"WWW-Authenticate": challenge})
            return inner(seen)

        return handle

    return serve


def own_realm(token_answer: Callable[[Seen], Answer]) -> Callable[[HostileRegistry], Handler]:
    """Bearer auth whose realm is this same server's /token (loopback http: allowed)."""
    return token_realm("http://{self}/token", token_answer)


def page_chain(seen: Seen) -> Answer:
    """Referrers pages that each link to the next, forever."""
    page = int(seen.path.rsplit("page=", 1)[1]) if "page=" in seen.path else 0
    link = f'<{REFERRERS}{SUBJECT}?page={page + 1}>; rel="next"'
    return json_answer(PUBLISHED.index(), OCI_INDEX, Link=link)


def redirect(location: str) -> Callable[[Seen], Answer]:
    return lambda seen: Answer(status=302, headers={"Location": location})


def foreign_link(foreign: HostileRegistry) -> Handler:
    link = f'<{foreign.url}{REFERRERS}{SUBJECT}?page=2>; rel="next"'
    return behind_auth(
        PUBLISHED.routes(
            **{REFERRERS: lambda seen: json_answer(PUBLISHED.index(), OCI_INDEX, Link=link)}
        )
    )


def redirect_to_a_challenger(foreign: HostileRegistry) -> Handler:
    """Redirects the manifest to `foreign`, which asks for a token from its own realm."""
    challenge = f'Bearer realm="{foreign.url}/token"'
    foreign.handler = lambda seen: Answer(status=401, headers={"WWW-Authenticate": challenge})
    return behind_auth(PUBLISHED.routes(**{MANIFEST_PATH: redirect(foreign.url + "/stolen")}))


def only_the_redirect_reached(registry: HostileRegistry, foreign: HostileRegistry) -> None:
    assert [s.path for s in foreign.seen] == ["/stolen"]  # its challenge was not answered


def foreign_untouched(registry: HostileRegistry, foreign: HostileRegistry) -> None:
    assert foreign.seen == []


def referrers_read_at_most(pages: int) -> Callable[[HostileRegistry, HostileRegistry], None]:
    def check(registry: HostileRegistry, foreign: HostileRegistry) -> None:
        asked = registry.requests_to(REFERRERS)
        assert 1 <= len(asked) <= pages + 1  # +1: the unauthenticated first try

    return check


def manifest_asked_at_most(count: int) -> Callable[[HostileRegistry, HostileRegistry], None]:
    def check(registry: HostileRegistry, foreign: HostileRegistry) -> None:
        assert 1 <= len(registry.requests_to(MANIFEST_PATH)) <= count

    return check


def sent_less_than(limit: int) -> Callable[[HostileRegistry, HostileRegistry], None]:
    def check(registry: HostileRegistry, foreign: HostileRegistry) -> None:
        assert registry.sent_bytes < limit

    return check


ANSI = "\x1b[2J\x1b[31mOWNED\x1b[0m"
OSC = "\x1b]0;owned\x07"  # sets the terminal's title; no "[" (that makes a URL invalid)


def cases() -> Iterator[Case]:
    # -- malformed JSON shapes --
    for name, body in MALFORMED_MANIFESTS.items():
        yield Case(f"manifest-{name}", published(image_manifest=body), "malformed manifest")
    for name, config in MALFORMED_CONFIGS.items():
        yield Case(name, manifest_with(setter("config", config)), "returned a malformed manifest")
    yield Case(
        "config-missing", manifest_with(lambda d: d.pop("config")), "config is not an object"
    )
    yield Case("layers-string", manifest_with(setter("layers", "x")), "layers is not a list")
    yield Case("layers-not-objects", manifest_with(setter("layers", [1, "a"])), "not a JSON object")
    yield Case("media-type-int", manifest_with(setter("mediaType", 7)), "mediaType is not a string")
    for name, (children, why) in MALFORMED_PLATFORM_INDEXES.items():
        index = canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": children})
        yield Case(name, published(image_manifest=index), ("returned a malformed index", why))
    for name, (report, why) in MALFORMED_SMOKE_REPORTS.items():
        yield Case(name, published(smoke=report), ("returned a malformed smoke report", why))
    yield Case(
        "smoke-for-another-image",
        published(smoke=canonical({"passed": True, "image_id": "sha256:" + "c" * 64})),
        "the attached smoke report is for image sha256:ccc",
    )
    yield Case(
        "smoke-did-not-pass",
        published(smoke=canonical({"passed": False, "image_id": PUBLISHED.image_id})),
        "did not pass",
    )
    for name, (change, why) in MALFORMED_EVIDENCE.items():
        yield Case(name, evidence_with(change), why)
    for name, descriptor in MALFORMED_DESCRIPTORS.items():
        yield Case(name, index_with(descriptor), "returned a malformed referrers index")
    for name, body in MALFORMED_INDEXES.items():
        yield Case(name, published(referrers_index=body), "returned a malformed referrers index")
    yield Case(
        "digest-header-junk",
        answering(
            MANIFEST_PATH,
            lambda seen: json_answer(
                PUBLISHED.manifest(), OCI_MANIFEST, **{"Docker-Content-Digest": "junk"}
            ),
        ),
        "malformed Docker-Content-Digest header",
    )
    yield Case(
        "digest-header-lies",
        answering(
            MANIFEST_PATH,
            lambda seen: json_answer(
                PUBLISHED.manifest(),
                OCI_MANIFEST,
                **{"Docker-Content-Digest": "sha256:" + "d" * 64},
            ),
        ),
        "the registry sent content whose digest is",
    )
    # -- token answers (the realm is the registry itself, loopback http: allowed) --
    for name, body in {
        "token-not-json": b"token=abc",
        "token-list": b"[]",
        "token-missing": b'{"expires_in": 60}',
        "token-with-newline": b'{"token": "abc\\r\\nX-Injected: 1"}',
        "token-too-long": canonical({"token": "t" * 20_000}),
    }.items():
        yield Case(
            name,
            own_realm(lambda seen, body=body: json_answer(body)),
            "returned a malformed token answer",
        )
    yield Case(
        "token-answer-huge",
        own_realm(lambda seen: Answer(body=junk(8 * MIB), length=None)),
        "sent more than 256 KiB",
    )
    yield Case(
        "token-service-failing",
        own_realm(lambda seen: Answer(status=500)),
        "answered HTTP 500",
    )
    # -- where credentials may go --
    yield Case(
        "realm-plain-http-elsewhere",
        token_realm(
            "http://tokens.hostile.example/token", lambda seen: json_answer(b'{"token":"t"}')
        ),
        "plain http off this machine",
        check=foreign_untouched,  # the foreign server is the HTTP proxy: nothing reached it
    )
    yield Case(
        "realm-not-http",
        token_realm("ftp://tokens.hostile.example/token", lambda seen: json_answer(b"{}")),
        "malformed bearer challenge",
        check=foreign_untouched,
    )
    yield Case(
        "realm-with-controls",
        token_realm(f"http://tokens{OSC}.example/token", lambda seen: json_answer(b"{}")),
        ("malformed bearer challenge", "http://tokens\\x1b]0;owned\\x07.example/token"),
        check=foreign_untouched,
    )
    yield Case(
        "link-to-another-host",
        foreign_link,
        "at another origin (http://127.0.0.1:",
        check=foreign_untouched,
    )
    yield Case(
        "link-to-another-scheme",
        answering(
            REFERRERS,
            lambda seen: json_answer(
                PUBLISHED.index(),
                OCI_INDEX,
                Link=f'<https://{seen.headers["Host"]}{REFERRERS}x>; rel="next"',
            ),
        ),
        "at another origin (https://127.0.0.1:",
    )
    yield Case(
        "link-loop",
        answering(
            REFERRERS,
            lambda seen: json_answer(
                PUBLISHED.index(), OCI_INDEX, Link=f'<{seen.path}>; rel="next"'
            ),
        ),
        "link back to a page already read",
        check=referrers_read_at_most(2),
    )
    yield Case(
        "link-chain-forever",
        answering(REFERRERS, page_chain),
        f"more than {MAX_PAGES} pages",
        check=referrers_read_at_most(MAX_PAGES),
    )
    yield Case(
        "redirected-to-another-host-that-challenges",
        redirect_to_a_challenger,
        "which answered HTTP 401",
        check=only_the_redirect_reached,
    )
    yield Case(
        "redirect-loop",
        answering(MANIFEST_PATH, lambda seen: Answer(status=307, headers={"Location": seen.path})),
        f"more than {MAX_REDIRECTS} times",
        check=manifest_asked_at_most(MAX_REDIRECTS + 2),
    )
    yield Case(
        "redirect-to-a-file",
        answering(MANIFEST_PATH, redirect("file:///etc/passwd")),
        "not an http(s) URL",
    )
    yield Case(
        "redirect-without-location",
        answering(MANIFEST_PATH, lambda seen: Answer(status=301)),
        "not an http(s) URL",
    )
    # -- size and time --
    for name, answer in {
        "huge-manifest-with-length": lambda seen: Answer(body=junk(64 * MIB), length=64 * MIB),
        "huge-manifest-without-length": lambda seen: Answer(body=junk(64 * MIB), length=None),
        "huge-manifest-chunked": lambda seen: Answer(
            body=chunked(junk(64 * MIB)), length=None, headers={"Transfer-Encoding": "chunked"}
        ),
        "huge-manifest-short-length": lambda seen: Answer(body=junk(64 * MIB), length=3 * MIB),
    }.items():
        expect = "sent more than 4 MiB" if "short" not in name else "malformed manifest"
        yield Case(name, answering(MANIFEST_PATH, answer), expect, check=sent_less_than(32 * MIB))
    yield Case(
        "huge-error-body",
        answering(MANIFEST_PATH, lambda seen: Answer(status=400, body=junk(64 * MIB), length=None)),
        "refused GET",
        check=sent_less_than(32 * MIB),
    )
    yield Case(
        "huge-blob",
        answering("/blobs/", lambda seen: Answer(body=junk(64 * MIB), length=None)),
        "sent more than",
        check=sent_less_than(32 * MIB),
    )
    yield Case(
        "length-larger-than-body",
        answering(MANIFEST_PATH, lambda seen: Answer(body=b"{}", length=1000)),
        "did not complete",
    )
    yield Case(
        "body-dripped",
        answering(
            MANIFEST_PATH,
            lambda seen: Answer(
                body=one_byte_at_a_time(PUBLISHED.manifest()), length=None, pause=0.5
            ),
        ),
        f"within {DEADLINE} s",
    )
    yield Case(
        "headers-dripped",
        answering(
            MANIFEST_PATH,
            lambda seen: Answer(
                raw=one_byte_at_a_time(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000), pause=0.3
            ),
        ),
        f"within {DEADLINE} s",
    )
    yield Case(
        "chunk-size-dripped",
        answering(
            MANIFEST_PATH,
            lambda seen: Answer(
                raw=[
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                    *one_byte_at_a_time(b"0" * 1000),
                ],
                pause=0.3,
            ),
        ),
        f"within {DEADLINE} s",
    )
    yield Case(
        "never-answers",
        answering(MANIFEST_PATH, lambda seen: Answer(stall=True)),
        f"within {DEADLINE} s",
    )
    yield Case(
        "too-many-headers",
        answering(MANIFEST_PATH, lambda seen: Answer(headers={f"X-{i}": "x" for i in range(200)})),
        "cannot reach registry",
        env={DEADLINE_ENV: "10"},
    )
    # -- retries --
    yield Case(
        "429-with-retry-after",
        answering(MANIFEST_PATH, lambda seen: Answer(status=429, headers={"Retry-After": "1"})),
        "answered HTTP 429",
        env={DEADLINE_ENV: "10"},
        check=manifest_asked_at_most(5),
    )
    yield Case(
        "503-forever",
        answering(MANIFEST_PATH, lambda seen: Answer(status=503)),
        "answered HTTP 503",
        env={DEADLINE_ENV: "10"},
        check=manifest_asked_at_most(5),
    )
    yield Case(
        "503-retry-after-a-day",
        answering(MANIFEST_PATH, lambda seen: Answer(status=503, headers={"Retry-After": "86400"})),
        # Retry-After is capped at 10 s, and the 3 s deadline leaves no room for it.
        f"within {DEADLINE} s (1 try; the last answered HTTP 503)",
        check=manifest_asked_at_most(2),
    )
    yield Case(
        "502-retry-after-a-date",
        answering(
            MANIFEST_PATH,
            lambda seen: Answer(
                status=502, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}
            ),
        ),
        "answered HTTP 502 to 127.0.0.1",
        check=manifest_asked_at_most(5),
    )
    # -- what the registry says is shown escaped --
    yield Case(
        "error-message-with-controls",
        answering(
            MANIFEST_PATH, lambda seen: oci_error(400, "BAD\x1b[1m", f"no{ANSI}\u202ekcatta\r\nX")
        ),
        "\\x1b[31mOWNED",
    )
    yield Case(
        "error-body-nested-deep",
        answering(MANIFEST_PATH, lambda seen: Answer(status=400, body=nested(200_000))),
        "refused GET",
    )
    # -- bad input --
    yield Case(
        "timeout-not-a-number",
        published(),
        f"{DEADLINE_ENV}='soon'",
        env={DEADLINE_ENV: "soon"},
        code=EXIT_BAD_INPUT,
    )
    yield Case(
        "timeout-negative",
        published(),
        "is not a number of seconds",
        env={DEADLINE_ENV: "-1"},
        code=EXIT_BAD_INPUT,
    )


CASES = [case for case in cases() if case is not None]


def test_the_corpus_is_large_and_unique() -> None:
    assert len(CASES) >= 40
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_verify_fails_cleanly_against_a_hostile_registry(case: Case, tmp_path: Path) -> None:
    with HostileRegistry() as foreign, HostileRegistry() as registry:
        registry.handler = case.serve(foreign)
        env = dict(case.env)
        if case.id.startswith("realm-"):
            env["HTTP_PROXY"] = env["http_proxy"] = foreign.url  # anything off-host lands here
        result = verify(registry.host, tmp_path, env=env)
        line = error_line(result, case.code)
        expected = (case.expect,) if isinstance(case.expect, str) else case.expect
        assert [text for text in expected if text not in line] == [], line
        assert len(line) < 1000
        no_credentials_seen(foreign)
        if case.check is not None:
            case.check(registry, foreign)


def test_verify_passes_and_prints_registry_strings_escaped(tmp_path: Path) -> None:
    train = {"loss_first": ANSI, "loss_last": "\u202e0.1\n\x9b31m"}
    with HostileRegistry() as registry:
        registry.handler = behind_auth(PUBLISHED.with_(train=train).routes())
        result = verify(registry.host, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not [s for s in SECRETS if s in result.stdout + result.stderr]
    assert f"smoke report of image {PUBLISHED.image_id}: passed" in result.stdout
    assert "loss \\x1b[2J\\x1b[31mOWNED\\x1b[0m -> \\u202e0.1\\n\\x9b31m;" in result.stdout
    assert not [c for c in result.stdout if c in "\x1b\x9b\u202e\r"]


def test_verify_json_keeps_control_characters_escaped(tmp_path: Path) -> None:
    with HostileRegistry() as registry:
        registry.handler = behind_auth(PUBLISHED.with_(train={"loss_first": ANSI}).routes())
        result = verify(registry.host, tmp_path, json_output=True)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert json.loads(result.stdout)["smoke"]["train"]["loss_first"] == ANSI


def test_a_registry_that_is_not_there_fails_after_bounded_tries(tmp_path: Path) -> None:
    with HostileRegistry() as gone:
        host = gone.host
    result = verify(host, tmp_path, env={DEADLINE_ENV: "10"})
    line = error_line(result)
    assert f"cannot reach registry {host}" in line
    assert "after 4 tries (Connection refused)" in line


def write_docker_config(directory: Path, host: str) -> None:
    directory.mkdir(exist_ok=True)
    auth = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    (directory / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


@pytest.mark.parametrize(
    ("serve", "expect"),
    [(foreign_link, "at another origin"), (redirect_to_a_challenger, "which answered HTTP 401")],
    ids=["link-to-another-host", "redirected-to-another-host"],
)
def test_docker_config_credentials_stay_with_their_registry(
    serve: Callable[[HostileRegistry], Handler], expect: str, tmp_path: Path
) -> None:
    with HostileRegistry() as foreign, HostileRegistry() as registry:
        registry.handler = serve(foreign)
        write_docker_config(tmp_path / "docker-config", registry.host)
        result = verify(registry.host, tmp_path, env={USERNAME_ENV: "", PASSWORD_ENV: ""})
        assert expect in error_line(result)
        assert [s.authorization is not None for s in registry.seen][:2] == [False, True]
    no_credentials_seen(foreign)


def test_the_proxy_sees_what_goes_off_host(tmp_path: Path) -> None:
    """The control for the realm cases: a request that may leave (a loopback realm outside
    NO_PROXY) does reach the proxy, so the proxy seeing nothing there means nothing left."""
    with HostileRegistry() as proxy, HostileRegistry() as registry:
        proxy.handler = lambda seen: json_answer(b'{"token": "granted"}')
        registry.handler = token_realm("http://127.0.0.2:9/token", lambda seen: Answer())(proxy)
        result = verify(registry.host, tmp_path, env={"HTTP_PROXY": proxy.url})
    assert result.returncode == 0, result.stderr
    assert [s.path.split("?")[0] for s in proxy.seen] == ["http://127.0.0.2:9/token"]


def test_a_redirect_from_https_to_plain_http_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tls = self_signed(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls[0]))
    away = redirect(f"http://registry.hostile.example/v2/{REPOSITORY}/manifests/{TAG}")
    with HostileRegistry() as proxy, HostileRegistry(tls=tls) as registry:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        registry.handler = behind_auth(PUBLISHED.routes(**{MANIFEST_PATH: away}))
        client = client_for(registry, scheme="https")
        assert client.manifest_digest(REPOSITORY, SUBJECT) == SUBJECT  # https works here
        with pytest.raises(RegistryError) as caught:
            client.get_manifest(REPOSITORY, TAG)
    assert "from https to plain http (http://registry.hostile.example:80)" in caught.value.message
    assert proxy.seen == []
    assert not [s for s in SECRETS if s in shown(caught.value, client, caplog)]


# -- the client in-process: credentials, memory, deadlines --------------------------------


@pytest.fixture
def foreign() -> Iterator[HostileRegistry]:
    with HostileRegistry(PUBLISHED.routes()) as server:
        yield server


def client_for(server: HostileRegistry, **kwargs: Any) -> RegistryClient:
    return RegistryClient(server.host, credentials=CREDENTIALS, deadline=3, **kwargs)


def shown(error: BaseException, client: RegistryClient, caplog: pytest.LogCaptureFixture) -> str:
    """Everything a user or a log could see of a failure."""
    return "\n".join([str(error), repr(error), repr(client), caplog.text, str(error.args)])


def test_a_well_behaved_registry_needs_no_retries(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with (
        HostileRegistry(behind_auth(PUBLISHED.routes())) as registry,
        client_for(registry) as client,
    ):
        assert client.manifest_digest(REPOSITORY, TAG) == SUBJECT  # HEAD, then GETs
        files = find_evidence(client, REPOSITORY, SUBJECT)
    assert files["smoke-report.json"] == PUBLISHED.smoke_report()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(registry.seen) == 6  # 401, HEAD, referrers, evidence manifest, two blobs
    assert "Resetting dropped connection" not in caplog.text  # answers read to their end


def test_a_redirect_to_another_host_carries_no_credentials(
    foreign: HostileRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    location = f"{foreign.url}/v2/{REPOSITORY}/manifests/{SUBJECT}"
    with (
        HostileRegistry(
            behind_auth(PUBLISHED.routes(**{MANIFEST_PATH: redirect(location)}))
        ) as registry,
        client_for(registry) as client,
    ):
        manifest, _, digest = client.get_manifest(REPOSITORY, TAG)
    assert digest == SUBJECT
    assert manifest["config"]["digest"] == PUBLISHED.image_id
    assert [s.path for s in foreign.seen] == [f"/v2/{REPOSITORY}/manifests/{SUBJECT}"]
    no_credentials_seen(foreign)
    assert [s.authorization is not None for s in registry.seen] == [False, True]
    assert not [s for s in SECRETS if s in caplog.text]


def test_a_next_link_to_another_host_is_not_followed(
    foreign: HostileRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with (
        HostileRegistry(foreign_link(foreign)) as registry,
        client_for(registry) as client,
        pytest.raises(RegistryError) as caught,
    ):
        client.referrers(REPOSITORY, SUBJECT, EVIDENCE_TYPE)
    assert foreign.seen == []
    assert "envbuild follows pages only on the registry itself" in caught.value.message
    assert not [s for s in SECRETS if s in shown(caught.value, client, caplog)]


def test_an_identity_token_is_not_posted_to_a_redirect_elsewhere(
    foreign: HostileRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    refresh = Credentials(username="<token>", password="", identity_token=SECRET, source="test")
    serve = own_realm(lambda seen: Answer(status=307, headers={"Location": foreign.url + "/token"}))
    with HostileRegistry() as registry:
        registry.handler = serve(foreign)
        client = RegistryClient(registry.host, credentials=refresh, deadline=3)
        with pytest.raises(
            RegistryError, match="with its request body to another origin"
        ) as caught:
            client.manifest_digest(REPOSITORY, TAG)
    assert foreign.seen == []
    assert [s.method for s in registry.requests_to("^/token")] == ["POST"]
    assert not [s for s in SECRETS if s in shown(caught.value, client, caplog)]


@pytest.mark.parametrize("length", ["declared", "undeclared"])
def test_a_huge_manifest_is_cut_off_at_the_cap_in_bounded_memory(length: str) -> None:
    answer = Answer(body=junk(64 * MIB), length=64 * MIB if length == "declared" else None)
    with HostileRegistry(PUBLISHED.routes(**{MANIFEST_PATH: lambda seen: answer})) as registry:
        client = client_for(registry)
        tracemalloc.start()
        try:
            with pytest.raises(RegistryError, match="sent more than 4 MiB"):
                client.manifest_raw(REPOSITORY, TAG)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 * MIB
    assert registry.sent_bytes < 32 * MIB


@pytest.mark.parametrize(
    "answer",
    [
        Answer(stall=True),
        Answer(body=one_byte_at_a_time(b'{"manifest": true}' * 100), length=None, pause=0.2),
        Answer(raw=one_byte_at_a_time(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200), pause=0.1),
    ],
    ids=["never-answers", "body-dripped", "headers-dripped"],
)
def test_the_deadline_holds_whatever_the_server_does(answer: Answer) -> None:
    with HostileRegistry(PUBLISHED.routes(**{MANIFEST_PATH: lambda seen: answer})) as registry:
        client = client_for(registry)
        error = outcome_of(lambda: client.manifest_raw(REPOSITORY, TAG))
    assert isinstance(error, RegistryUnreachable)
    assert "did not complete" in str(error)
    assert "within 3 s" in str(error)


def outcome_of(action: Callable[[], object]) -> object:
    """What `action` returned or the EnvbuildError it raised, run in a thread that must end
    within a minute (a hang guard: the deadlines under test are 3 s)."""
    outcome: list[object] = []

    def attempt() -> None:
        try:
            outcome.append(action())
        except EnvbuildError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    assert len(outcome) == 1
    return outcome[0]


def test_one_deadline_bounds_a_whole_evidence_lookup() -> None:
    slow = Answer(body=one_byte_at_a_time(PUBLISHED.smoke_report()), length=None, pause=0.05)
    routes = PUBLISHED.routes(**{"/blobs/": lambda seen: slow})
    with (
        HostileRegistry(routes) as registry,
        client_for(registry) as client,
        client.operation(),
        pytest.raises(RegistryUnreachable, match="within 3 s"),
    ):
        find_evidence(client, REPOSITORY, SUBJECT)


def test_malformed_answers_are_registry_malformed_errors() -> None:
    routes = PUBLISHED.with_(image_manifest=b"[1, 2]").routes()
    with (
        HostileRegistry(routes) as registry,
        client_for(registry) as client,
        pytest.raises(RegistryMalformed) as caught,
    ):
        client.get_manifest(REPOSITORY, TAG)
    assert caught.value.message.startswith(
        f"registry {registry.host} returned a malformed manifest"
    )


# -- the pure rules ----------------------------------------------------------------


CONTROLS = [chr(c) for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]] + [
    "\u2028",
    "\u2029",
    *(chr(c) for c in range(0x202A, 0x202F)),
    *(chr(c) for c in range(0x2066, 0x206A)),
]


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_printable_escapes_every_control_and_bidi_character(char: str) -> None:
    text = printable(f"a{char}b")
    assert char not in text
    assert text.startswith("a\\")
    assert text.endswith("b")


def test_printable_truncates() -> None:
    assert printable("x" * 1000, 50) == "x" * 50 + "..."


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("https://auth.example.com/token", True),
        ("http://127.0.0.1:5001/token", True),
        ("http://localhost/token", True),
        ("http://[::1]:8080/token", True),
        ("http://auth.example.com/token", False),
        ("http://10.0.0.1/token", False),
        ("ftp://auth.example.com/token", False),
        ("https://user@auth.example.com/token", False),
        ("token", False),
    ],
)
def test_credentials_travel_only_over_https_or_loopback(url: str, safe: bool) -> None:
    assert safe_for_credentials(url) is safe


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://r.example/v2/x", "https://R.EXAMPLE:443/v2/y?n=2", True),
        ("http://127.0.0.1:5000/a", "http://127.0.0.1:5000/b", True),
        ("http://127.0.0.1:5000/a", "http://127.0.0.1:5001/a", False),
        ("https://r.example/a", "http://r.example/a", False),
        ("https://r.example/a", "https://r.example.evil/a", False),
        ("https://r.example/a", "file:///etc/passwd", False),
    ],
)
def test_same_origin_means_scheme_host_and_port(a: str, b: str, same: bool) -> None:
    assert same_origin(a, b) is same


def test_a_downgrade_is_https_to_plain_http_off_loopback() -> None:
    assert is_downgrade("https://r.example/a", "http://r.example/a")
    assert not is_downgrade("https://r.example/a", "http://127.0.0.1:5000/a")
    assert not is_downgrade("http://127.0.0.1/a", "http://127.0.0.1:5000/a")


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("0", 0.0), ("3", 3.0), ("86400", 10.0), ("soon", None), ("", None), (None, None)],
)
def test_retry_after_is_bounded(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header) == seconds


def _special_configs(folder: Path) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """Ways Docker's config.json can be anything but a small JSON object in a regular file."""

    def fifo(path: Path) -> None:
        os.mkfifo(path)

    def fifo_link(path: Path) -> None:
        os.mkfifo(folder / "pipe")
        path.symlink_to(folder / "pipe")

    def directory(path: Path) -> None:
        path.mkdir()

    def device(path: Path) -> None:
        path.symlink_to("/dev/zero")

    def socket_file(path: Path) -> None:
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))  # left bound: nothing will ever answer on it

    def writes(data: bytes) -> Callable[[Path], None]:
        return lambda path: path.write_bytes(data)

    yield "fifo", fifo
    yield "link-to-a-fifo", fifo_link
    yield "directory", directory
    yield "dev-zero", device
    yield "socket", socket_file
    yield "huge", writes(b'{"auths": {"x": "' + b"a" * (2 << 20) + b'"}}')
    yield "deeply-nested", writes(b"[" * 100_000)
    yield "not-utf8", writes(b'{"auths": "\xff\xfe"}')
    yield "a-list", writes(b"[]")
    yield "a-string", writes(b'"auths"')


@pytest.mark.parametrize("kind", [name for name, _ in _special_configs(Path())])
def test_a_docker_config_that_is_not_a_small_regular_file_is_one_line_never_a_hang(
    kind: str, tmp_path: Path
) -> None:
    # The credentials lookup and the proxy choice read it (issue 27): regular files only,
    # opened without blocking, bounded; verify's 90 s hang guard fails the test on a hang.
    folder = tmp_path / "docker-config"
    folder.mkdir()
    make = dict(_special_configs(folder))[kind]
    make(folder / "config.json")
    result = verify("127.0.0.1:9", tmp_path, env={USERNAME_ENV: "", PASSWORD_ENV: ""})
    assert "Docker's config" in error_line(result, code=EXIT_BAD_INPUT)


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero", "huge"])
def test_the_credentials_lookup_reads_docker_config_the_same_way(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from envbuild.net.credentials import lookup_credentials

    folder = tmp_path / "docker-config"
    folder.mkdir()
    dict(_special_configs(folder))[kind](folder / "config.json")
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    for name in (USERNAME_ENV, PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(BadInput, match=r"Docker's config .*config\.json"):
        lookup_credentials("registry.example.com")


PLANNED = FrameworkState(
    entry_id="e", title="torch 2.4", key="ab" * 32, image=f"envbuild/framework:{TAG}"
)
PLAN_CASES = {
    "never-answers": (Answer(stall=True), "within 3 s"),
    "headers-dripped": (
        Answer(raw=one_byte_at_a_time(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200), pause=0.1),
        "within 3 s",
    ),
    "500-forever": (Answer(status=500, body=b"{}"), "500"),
    "digest-header-not-a-digest": (
        Answer(headers={"Docker-Content-Digest": "sha256:\x1b[2J" + "z" * 60}),
        "digest",
    ),
    "manifest-not-json": (Answer(status=200, body=b"\x1b[31m" * 1000), "manifest"),
}


@pytest.mark.parametrize("case", PLAN_CASES, ids=list(PLAN_CASES))
def test_plan_frameworks_asks_a_hostile_registry_under_one_deadline_in_one_line(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer, expect = PLAN_CASES[case]
    monkeypatch.setenv(DEADLINE_ENV, DEADLINE)
    monkeypatch.setenv(USERNAME_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    routes = behind_auth(PUBLISHED.routes(**{MANIFEST_PATH: lambda seen: answer}))
    with HostileRegistry(routes) as registry:
        error = outcome_of(lambda: published_states(f"{registry.host}/team", [PLANNED]))
        asked = [seen.path for seen in registry.seen]
    assert isinstance(error, RegistryError), error
    said = str(error)
    assert expect in said
    assert "\n" not in said
    assert len(said) < 1000
    assert not [c for c in said if c in "\x1b\x9b"]
    assert not [s for s in SECRETS if s in said + repr(error)]
    assert all(path.startswith("/v2/team/framework/") or path == "/v2/" for path in asked), asked


def test_plan_frameworks_says_published_by_digest_or_not_in_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(USERNAME_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    other = dataclasses.replace(PLANNED, entry_id="f", image="envbuild/framework:absent")
    digest = sha256(PUBLISHED.manifest())
    held = Answer(
        headers={"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": digest},
        body=PUBLISHED.manifest(),
    )
    routes = PUBLISHED.routes(**{f"^/v2/team/framework/manifests/{TAG}$": lambda seen: held})
    with HostileRegistry(behind_auth(routes)) as registry:
        found = published_states(f"{registry.host}/team", [PLANNED, other, PLANNED])
        asked = [seen.path for seen in registry.seen if "/manifests/" in seen.path]
    # Each tag asked once (a request, and again with the credentials the challenge asked for).
    assert len(set(asked)) == 2
    assert len(asked) <= 4
    assert [state.published for state in found] == [
        f"{registry.host}/team/framework:{TAG}@{digest}",
        None,
        f"{registry.host}/team/framework:{TAG}@{digest}",
    ]
