"""A Docker Engine API on 127.0.0.1 that answers well, or one request badly, for the hostile tier.

`HostileEngine(endpoint=..., answer=...)` serves, over `HostileRegistry`'s real HTTP server,
enough of the Engine API for whole `envbuild` processes (DOCKER_HOST=tcp://127.0.0.1:PORT) to
connect, clean up leftovers, probe a base image in a container, build an image, smoke-test it,
tag and push it: versioned paths (/v1.41/...), chunked JSON streams for builds and pushes, and
multiplexed logs. Containers, images and networks are kept, so a test can tell what a run left
behind. One endpoint (`ENDPOINTS`) can be made to answer with one of `HOSTILE_ANSWERS` every time
it is asked, or the first `times` times: an error status, garbage, an HTML page, nothing, a stall,
a body cut short.

It is not the real engine: nothing runs, and a build only reports an image id.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import shlex
import socket
import struct
import tarfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from tests.support.hostile_registry import Answer, HostileRegistry, Seen, chunked

API_VERSION = "1.41"  # Docker 20.10, the oldest engine envbuild's tests drive
# A framework label makes every image one `envbuild smoke` accepts.
IMAGE_LABELS = {"org.envbuild.framework": "torch"}
LEFTOVER = "f" * 64  # a dead smoke container of an earlier run, seeded for the clean-up to find


@dataclass(frozen=True)
class Endpoint:
    """One request of the Engine API, as `method` and a pattern of the unversioned path."""

    name: str
    method: str
    pattern: str

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and re.fullmatch(self.pattern, path) is not None


ENDPOINTS = tuple(
    Endpoint(f"{method} {shown}", method, pattern)
    for method, shown, pattern in (
        ("GET", "/version", r"/version"),
        ("GET", "/_ping", r"/_ping"),
        ("GET", "/info", r"/info"),
        ("GET", "/containers/json", r"/containers/json"),
        ("POST", "/containers/create", r"/containers/create"),
        ("GET", "/containers/{id}/json", r"/containers/[^/]+/json"),
        ("PUT", "/containers/{id}/archive", r"/containers/[^/]+/archive"),
        ("POST", "/containers/{id}/start", r"/containers/[^/]+/start"),
        ("POST", "/containers/{id}/wait", r"/containers/[^/]+/wait"),
        ("GET", "/containers/{id}/logs", r"/containers/[^/]+/logs"),
        ("POST", "/containers/{id}/kill", r"/containers/[^/]+/kill"),
        ("DELETE", "/containers/{id}", r"/containers/[^/]+"),
        ("POST", "/images/create", r"/images/create"),
        ("GET", "/images/{name}/json", r"/images/.+/json"),
        ("POST", "/images/{name}/tag", r"/images/.+/tag"),
        ("POST", "/images/{name}/push", r"/images/.+/push"),
        ("DELETE", "/images/{name}", r"/images/.+"),
        ("GET", "/networks", r"/networks"),
        ("GET", "/networks/{name}", r"/networks/[^/]+"),
        ("POST", "/networks/create", r"/networks/create"),
        ("POST", "/build", r"/build"),
    )
)
ENDPOINT_NAMES = tuple(e.name for e in ENDPOINTS)
# Endpoints whose answer is a stream of JSON documents (chunked), read as it comes.
STREAMED = ("POST /build", "POST /images/{name}/push", "POST /images/create")


def _json(document: Any, status: int = 200) -> Answer:
    return Answer(
        status=status,
        headers={"Content-Type": "application/json"},
        body=json.dumps(document).encode(),
    )


def _stream(documents: list[dict[str, Any]]) -> Answer:
    """A chunked stream of JSON documents, as the engine answers builds, pulls and pushes."""
    return Answer(
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        body=chunked([json.dumps(d).encode() + b"\r\n" for d in documents]),
        length=None,
    )


def _cut(head: bytes, *, declared: int) -> Answer:
    """A 200 that promises `declared` bytes of JSON, sends `head`, and closes the connection."""
    status = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    return Answer(raw=[status + b"Content-Length: %d\r\n\r\n" % declared + head])


def _cut_stream() -> Answer:
    """A chunked stream that ends mid-chunk: the engine died while answering."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return Answer(raw=[head + b'40\r\n{"stream": "Step 1/3 : FROM'])


# Each way an engine, a proxy in front of it or another server on its port can answer wrongly.
HOSTILE_ANSWERS: dict[str, Callable[[], Answer]] = {
    "404": lambda: _json({"message": "page not found"}, 404),
    "409": lambda: _json({"message": "conflict: hostile engine"}, 409),
    "500": lambda: _json({"message": "hostile engine: internal error"}, 500),
    "500-list-body": lambda: _json(["not", "an", "error", "document"], 500),
    "502-html": lambda: Answer(
        status=502,
        headers={"Content-Type": "text/html"},
        body=b"<html><body><h1>502 Bad Gateway</h1></body></html>",
    ),
    "html-page": lambda: Answer(
        headers={"Content-Type": "text/html"},
        body=b"<!doctype html><html><body>Welcome to nginx!</body></html>",
    ),
    "garbage-json": lambda: Answer(
        headers={"Content-Type": "application/json"}, body=b'{"Id": "abc", "State": {'
    ),
    "wrong-shape": lambda: _json("hostile"),
    "empty-body": lambda: Answer(headers={"Content-Type": "application/json"}, body=b""),
    "stalled": lambda: Answer(stall=True),
    "stalled-body": lambda: Answer(
        headers={"Content-Type": "application/json"}, body=b'{"Id": "ab', length=4096
    ),
    "truncated": lambda: _cut(b'{"Id": "ab', declared=4096),
    "truncated-stream": _cut_stream,
}
HOSTILE_NAMES = tuple(HOSTILE_ANSWERS)


def _frames(stream: int, text: str) -> bytes:
    """`text` as one frame of Docker's multiplexed log stream (1 stdout, 2 stderr)."""
    data = text.encode()
    return struct.pack(">BxxxL", stream, len(data)) + data if data else b""


def _id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def image_id_of(ref: str) -> str:
    """The id the fake engine gives the image `ref`, unless it built it."""
    return "sha256:" + _id(ref)


@dataclass
class _Container:
    id: str
    command: list[str]
    labels: dict[str, str]
    status: str = "created"


@dataclass
class HostileEngine:
    """The fake engine and its server; a context manager. `endpoint` answers with `answer`."""

    endpoint: str | None = None
    answer: str | None = None
    times: int | None = None  # how many asks of `endpoint` get `answer` (None: every one)
    missing: tuple[str, ...] = ()  # images that are not there until pulled
    # What a probe container prints: the OS and Python of every base image.
    probe_output: str = "os=debian bookworm\npython=3.11\n"
    containers: dict[str, _Container] = field(default_factory=dict)
    images: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # ref -> id, labels
    networks: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # container ids, in order
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _answered: int = 0  # asks of `endpoint` so far

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.endpoint not in ENDPOINT_NAMES:
            raise ValueError(self.endpoint)
        self.containers[LEFTOVER] = _Container(
            LEFTOVER, ["true"], {"org.envbuild.role": "smoke"}, status="dead"
        )
        self.server = HostileRegistry(self.handle)
        self.docker_host = f"tcp://{self.server.host}"

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def asked(self) -> list[str]:
        """The endpoint of every request so far, in order."""
        return [self.endpoint_of(s) or f"? {s.method} {s.path}" for s in self.seen]

    def left_behind(self) -> list[str]:
        """Containers this run created that are still there."""
        return [c for c in self.containers if c != LEFTOVER and c not in self.removed]

    @staticmethod
    def endpoint_of(seen: Seen) -> str | None:
        path = _unversioned(seen.path)
        method = "GET" if seen.method == "HEAD" else seen.method
        return next((e.name for e in ENDPOINTS if e.matches(method, path)), None)

    def handle(self, seen: Seen) -> Answer:
        """The answer to one request: the hostile one at `endpoint`, else the engine's."""
        name = self.endpoint_of(seen)
        if name is not None and name == self.endpoint and self.answer is not None:
            with self._lock:
                hostile = self.times is None or self._answered < self.times
                self._answered += 1
            if hostile:
                return HOSTILE_ANSWERS[self.answer]()
        path = _unversioned(seen.path)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(seen.path).query)
        with self._lock:
            return self._well(name, path, query, seen)

    def _well(self, name: str | None, path: str, query: dict[str, list[str]], seen: Seen) -> Answer:
        parts = path.strip("/").split("/")
        simple: dict[str, Callable[[], Answer]] = {
            "GET /version": lambda: _json(
                {
                    "Version": "20.10.24",
                    "ApiVersion": API_VERSION,
                    "MinAPIVersion": "1.12",
                    "Os": "linux",
                    "Arch": "amd64",
                }
            ),
            "GET /_ping": lambda: Answer(
                headers={"Content-Type": "text/plain", "Api-Version": API_VERSION}, body=b"OK"
            ),
            "GET /info": lambda: _json(
                {
                    "ServerVersion": "20.10.24",
                    "Name": socket.gethostname(),  # an engine on this host, as Docker says it
                    "Runtimes": {"runc": {"path": "runc"}},
                    "DockerRootDir": "/var/lib/docker",
                    "CDISpecDirs": [],
                }
            ),
            "GET /containers/json": lambda: _json(self._listed(query)),
            "POST /containers/create": lambda: self._create(seen),
            "PUT /containers/{id}/archive": lambda: self._container_said(parts[1], 200),
            "POST /containers/{id}/start": lambda: self._container_said(parts[1], 204, "exited"),
            "POST /containers/{id}/kill": lambda: self._container_said(parts[1], 204, "exited"),
            "POST /containers/{id}/wait": lambda: self._container_said(parts[1], 200),
            "GET /containers/{id}/json": lambda: self._inspect(parts[1]),
            "GET /containers/{id}/logs": lambda: self._logs(parts[1], query),
            "DELETE /containers/{id}": lambda: self._remove(parts[1]),
            "POST /images/create": lambda: self._pull(query),
            "GET /images/{name}/json": lambda: self._image(_image_name(path, "/json")),
            "POST /images/{name}/tag": lambda: self._tag(_image_name(path, "/tag"), query),
            "POST /images/{name}/push": lambda: self._push(_image_name(path, "/push")),
            "DELETE /images/{name}": lambda: self._untag(_image_name(path, "")),
            "GET /networks": lambda: _json([{"Name": n, "Id": _id(n)} for n in self.networks]),
            "GET /networks/{name}": lambda: self._network(parts[1]),
            "POST /networks/create": lambda: self._network_made(seen),
            "POST /build": lambda: self._build(query, seen.body),
        }
        if name is None:
            return _json({"message": f"page not found: {seen.method} {path}"}, 404)
        return simple[name]()

    def _listed(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        filters = json.loads(query.get("filters", ["{}"])[0])
        labels = filters.get("label") or []
        statuses = filters.get("status") or []
        found = []
        for container in self.containers.values():
            if container.id in self.removed or (statuses and container.status not in statuses):
                continue
            have = {f"{k}={v}" for k, v in container.labels.items()} | set(container.labels)
            if all(label in have for label in labels):
                found.append({"Id": container.id, "Labels": container.labels})
        return found

    def _create(self, seen: Seen) -> Answer:
        body = json.loads(seen.body or b"{}")
        container_id = _id(f"container-{next(self._ids)}")
        self.containers[container_id] = _Container(
            container_id, list(body.get("Cmd") or []), dict(body.get("Labels") or {})
        )
        return _json({"Id": container_id, "Warnings": []}, 201)

    def _container_said(self, container_id: str, status: int, state: str | None = None) -> Answer:
        container = self.containers.get(container_id)
        if container is None or container_id in self.removed:
            return _json({"message": f"No such container: {container_id}"}, 404)
        if state is not None:
            container.status = state
        if status == 200:
            return _json({"StatusCode": 0, "Error": None})
        return Answer(status=status)

    def _inspect(self, container_id: str) -> Answer:
        container = self.containers.get(container_id)
        if container is None or container_id in self.removed:
            return _json({"message": f"No such container: {container_id}"}, 404)
        state = {"Status": container.status, "ExitCode": 0, "OOMKilled": False,
                 "FinishedAt": "2020-01-01T00:00:00Z"}  # fmt: skip
        return _json(
            {"Id": container.id, "Name": f"/c{container.id[:8]}", "State": state,
             "Created": "2020-01-01T00:00:00Z",
             "Config": {"Tty": False, "Labels": container.labels, "Cmd": container.command}}
        )  # fmt: skip

    def _logs(self, container_id: str, query: dict[str, list[str]]) -> Answer:
        container = self.containers.get(container_id)
        if container is None or container_id in self.removed:
            return _json({"message": f"No such container: {container_id}"}, 404)
        probing = any("os-release" in part for part in container.command)
        stdout = self.probe_output if probing else "no smoke report from a fake engine\n"
        body = b""
        if query.get("stdout") == ["1"]:
            body += _frames(1, stdout)
        if query.get("stderr") == ["1"]:
            body += _frames(2, "")
        return Answer(headers={"Content-Type": "application/vnd.docker.raw-stream"}, body=body)

    def _remove(self, container_id: str) -> Answer:
        if container_id not in self.containers or container_id in self.removed:
            return _json({"message": f"No such container: {container_id}"}, 404)
        self.removed.append(container_id)
        return Answer(status=204)

    def _found(self, ref: str) -> tuple[str, dict[str, str]] | None:
        """The image `ref` (a tag or an id) names. Every image is there, but the missing ones:
        a base image, or one `envbuild smoke` or `publish` is given."""
        for name, (image_id, labels) in self.images.items():
            if ref in (name, image_id, image_id.removeprefix("sha256:")):
                return image_id, labels
        if ref in self.missing or ref.startswith("sha256:"):
            return None
        self.images[ref] = (image_id_of(ref), IMAGE_LABELS)
        return self.images[ref]

    def _image(self, ref: str) -> Answer:
        found = self._found(ref)
        if found is None:
            return _json({"message": f"No such image: {ref}"}, 404)
        image_id, labels = found
        tags = [name for name, (i, _) in self.images.items() if i == image_id and name != i]
        return _json(_image_document(image_id, tags, labels))

    def _pull(self, query: dict[str, list[str]]) -> Answer:
        ref = f"{query.get('fromImage', [''])[0]}:{query.get('tag', ['latest'])[0]}"
        self.missing = tuple(m for m in self.missing if m != ref)
        return _stream([{"status": f"Pulling from {ref}"}, {"status": "Download complete"}])

    def _tag(self, ref: str, query: dict[str, list[str]]) -> Answer:
        found = self._found(ref)
        if found is None:
            return _json({"message": f"No such image: {ref}"}, 404)
        self.images[f"{query['repo'][0]}:{query.get('tag', ['latest'])[0]}"] = found
        return Answer(status=201)

    def _untag(self, ref: str) -> Answer:
        if self.images.pop(ref, None) is None:
            return _json({"message": f"No such image: {ref}"}, 404)
        return _json([{"Untagged": ref}])

    def _push(self, repository: str) -> Answer:
        digest = "sha256:" + _id(f"pushed-{repository}")
        return _stream(
            [{"status": f"The push refers to repository [{repository}]"},
             {"status": f"latest: digest: {digest} size: 1"},
             {"progressDetail": {}, "aux": {"Tag": "latest", "Digest": digest, "Size": 1}}]
        )  # fmt: skip

    def _network(self, name: str) -> Answer:
        if name != "bridge" and name not in self.networks:
            return _json({"message": f"network {name} not found"}, 404)
        # The gateway a build's RUN steps reach: loopback, where envbuild's build server can listen.
        ipam = {"Config": [{"Subnet": "127.0.0.0/8", "Gateway": "127.0.0.1"}]}
        return _json({"Name": name, "Id": _id(name), "IPAM": ipam})

    def _network_made(self, seen: Seen) -> Answer:
        name = str(json.loads(seen.body or b"{}").get("Name"))
        self.networks.append(name)
        return _json({"Id": _id(name), "Warning": ""}, 201)

    def _build(self, query: dict[str, list[str]], context: bytes) -> Answer:
        """An image id for the build, its labels those of the query and of the Dockerfile's
        LABEL instructions; the Dockerfile read as Podman reads it: the one `dockerfile` value
        (the last of several), a file of the context's archive."""
        name = query.get("dockerfile", ["Dockerfile"])[-1]
        try:
            with tarfile.open(fileobj=io.BytesIO(context)) as archive:
                member = archive.extractfile(name)
                dockerfile = member.read().decode() if member is not None else None
        except (tarfile.TarError, KeyError):
            dockerfile = None
        if dockerfile is None:
            return _stream([{"error": f"stat /var/tmp/build/{name}: no such file or directory"}])
        image_id = "sha256:" + _id(f"image-{next(self._ids)}")
        labels = json.loads(query.get("labels", ["{}"])[0])
        for line in dockerfile.replace("\\\n", " ").splitlines():  # continued lines joined
            if line.startswith("LABEL "):
                labels |= dict(word.split("=", 1) for word in shlex.split(line[len("LABEL ") :]))
        for tag in query.get("t", []):
            self.images[tag] = (image_id, labels)
        self.images[image_id] = (image_id, labels)
        return _stream(
            [{"stream": "Step 1/2 : FROM python:3.11-slim-bookworm\n"},
             {"stream": " ---> 0123456789ab\n"}, {"aux": {"ID": image_id}},
             {"stream": f"Successfully built {image_id[7:19]}\n"}]
        )  # fmt: skip

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> HostileEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _unversioned(path: str) -> str:
    return re.sub(r"^/v\d+\.\d+(?=/)", "", urllib.parse.urlsplit(path).path)


def _image_name(path: str, suffix: str) -> str:
    return urllib.parse.unquote(path.removeprefix("/images/").removesuffix(suffix))


def _image_document(image_id: str, tags: list[str], labels: dict[str, str]) -> dict[str, Any]:
    return {"Id": image_id, "RepoTags": tags, "RepoDigests": [], "Config": {"Labels": labels},
            "Architecture": "amd64", "Os": "linux", "Size": 1}  # fmt: skip
