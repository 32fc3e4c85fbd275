"""Refreshes the PyPI-derived facts of a framework's knowledge file from PyPI itself.

PyPI tells what a plain `pip install <package>==X` pulls on Linux x86_64: release date,
Requires-Python, the CPython versions with a manylinux wheel, and the CUDA runtime, cuDNN
and NCCL pins of that wheel's Requires-Dist. Everything else in the file (other CUDA
variants, comments, sources) is curated by hand and left exactly as it is.
"""

from __future__ import annotations

import difflib
import email.parser
import json
import logging
import re
import struct
import tempfile
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
import yaml
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuild.errors import BadInput, EnvbuildError, MatrixError
from envbuild.resources import matrices_dir

log = logging.getLogger(__name__)

FRAMEWORK_PACKAGES = {"torch": "torch"}
PYPI_URL = "https://pypi.org"
PYPI_SOURCE = "pypi"  # the `source:` key of facts this module maintains
NEW_RELEASE_COMMENT = "# new: other CUDA variants not yet curated"
_USER_AGENT = "envbuild-knowledge-refresh (+https://pypi.org/pypi/<package>/json reader)"
_PREFERRED_PYTHON = (3, 11)  # the wheel whose metadata is read; its markers are evaluated for it
_FIELDS = ("released", "requires_python", "python", "pypi_variant", "source", "variants")


class PypiError(EnvbuildError):
    """PyPI could not be read or answered something envbuild cannot use."""


class PypiUnreachable(PypiError):
    """PyPI could not be reached, or kept failing, after retries."""


class PypiRejected(PypiError):
    """PyPI answered 4xx (404 Not Found, 403, ...) for a URL; retrying will not help."""

    def __init__(self, message: str, *, url: str, status: int) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


@dataclass(frozen=True, kw_only=True)
class ReleaseFacts:
    """What PyPI says about one release's Linux x86_64 wheels."""

    version: str
    released: str | None  # date of the release's earliest upload, YYYY-MM-DD
    requires_python: str | None
    python: tuple[str, ...]  # "3.11", ... with a plain CPython manylinux x86_64 wheel
    pypi_variant: str | None  # "12.1"; "cpu" when the wheel pins no CUDA; None: no such wheel
    cuda_runtime: str | None
    cudnn: str | None
    nccl: str | None


@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    """What a refresh found: whether the file disagrees with PyPI, and the diff."""

    changed: bool
    diff: tuple[str, ...]
    path: Path
    notes: tuple[str, ...] = ()  # things worth telling that are not differences


class PypiClient:
    """Reads PyPI's JSON API and wheel metadata over an injected requests.Session."""

    def __init__(
        self,
        session: requests.Session,
        *,
        index_url: str = PYPI_URL,
        tries: int = 4,
        backoff: float = 1.0,
        timeout: float = 60.0,
    ) -> None:
        self.session = session
        self.index_url = index_url.rstrip("/")
        self.tries = max(1, tries)
        self.backoff = backoff
        self.timeout = timeout

    def project_url(self, package: str) -> str:
        """The JSON API URL listing every release and file of `package`."""
        return f"{self.index_url}/pypi/{package}/json"

    def project(self, package: str) -> dict[str, Any]:
        """The JSON API document of `package` (all releases, their files, upload times)."""
        url = self.project_url(package)
        response = self._get(url)
        try:
            data = response.json()
        except ValueError as exc:
            msg = f"{url} did not return JSON ({exc}); a proxy may be rewriting PyPI's answers"
            raise PypiError(msg) from exc
        if not isinstance(data, dict) or not isinstance(data.get("releases"), dict):
            msg = f"{url} returned JSON without a 'releases' mapping; is it PyPI's JSON API?"
            raise PypiError(msg)
        return data

    def core_metadata(self, wheel_url: str) -> str:
        """The wheel's METADATA: PEP 658 `<url>.metadata`, else read from the zip by range."""
        try:
            return _decode(self._get(wheel_url + ".metadata").content)
        except PypiRejected as exc:
            if exc.status != 404:
                raise
        log.info("no PEP 658 metadata for %s; reading it from the wheel by range", wheel_url)
        return self._metadata_from_zip(wheel_url)

    def _metadata_from_zip(self, url: str) -> str:
        tail, size = self._get_range(url, "-65536")
        cd_offset, cd_size = _central_directory(tail, tail_start=size - len(tail), url=url)
        tail_start = size - len(tail)
        if cd_offset >= tail_start:
            cd = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
        else:
            cd, _ = self._get_range(url, f"{cd_offset}-{cd_offset + cd_size - 1}")
        entry = _metadata_entry(cd, url=url)
        header, _ = self._get_range(url, f"{entry.header_offset}-{entry.header_offset + 29}")
        if header[:4] != b"PK\x03\x04":
            msg = f"{url}: no zip local header at {entry.header_offset}; the wheel looks damaged"
            raise PypiError(msg)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = entry.header_offset + 30 + name_len + extra_len
        data, _ = self._get_range(url, f"{start}-{start + entry.compressed_size - 1}")
        if entry.method == 8:
            data = zlib.decompress(data, -15)
        elif entry.method != 0:
            msg = f"{url}: {entry.name} uses zip compression method {entry.method}; cannot read it"
            raise PypiError(msg)
        return _decode(data)

    def _get_range(self, url: str, byte_range: str) -> tuple[bytes, int]:
        """Bytes of `url` in `byte_range` ("a-b" or "-n") and the file's total size."""
        response = self._get(url, headers={"Range": f"bytes={byte_range}"}, stream=True)
        with response:
            if response.status_code != 206:
                msg = (
                    f"{url} ignored an HTTP range request (status {response.status_code}); "
                    "cannot read the wheel's METADATA without downloading it whole"
                )
                raise PypiError(msg)
            match = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", ""))
            if match is None:
                msg = f"{url} answered a range request without a usable Content-Range header"
                raise PypiError(msg)
            return response.content, int(match.group(1))

    def _get(
        self, url: str, *, headers: Mapping[str, str] | None = None, stream: bool = False
    ) -> requests.Response:
        """GET with retries on connection errors, 429 and 5xx; any other 4xx fails at once."""
        all_headers = {"User-Agent": _USER_AGENT, **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            last = attempt >= self.tries
            try:
                response = self.session.get(
                    url, headers=all_headers, timeout=self.timeout, stream=stream
                )
            except requests.exceptions.SSLError as exc:
                msg = (
                    f"cannot reach {url}: TLS verification failed ({_one_line(exc)}); behind a "
                    "TLS-intercepting proxy set REQUESTS_CA_BUNDLE to its CA bundle"
                )
                raise PypiUnreachable(msg) from exc
            except requests.RequestException as exc:
                if last:
                    msg = (
                        f"cannot reach {url} after {self.tries} tries: {_one_line(exc)}; check "
                        "the network or proxy (HTTPS_PROXY; REQUESTS_CA_BUNDLE for a "
                        "TLS-intercepting proxy)"
                    )
                    raise PypiUnreachable(msg) from exc
                log.warning("GET %s failed (%s); retrying", url, _one_line(exc))
                self._pause(attempt, None)
                continue
            status = response.status_code
            if status < 400:
                return response
            response.close()
            if status == 429 or status >= 500:
                if last:
                    msg = (
                        f"{url} answered HTTP {status} {response.reason or ''} "
                        f"{self.tries} times; PyPI or the proxy is failing, try again later"
                    )
                    raise PypiUnreachable(" ".join(msg.split()))
                log.warning("GET %s answered HTTP %s; retrying", url, status)
                self._pause(attempt, response.headers.get("Retry-After"))
                continue
            msg = f"{url} answered HTTP {status} {response.reason or ''}".rstrip()
            hint = (
                "; check the package name and the index URL"
                if status == 404
                else "; check the index URL and any proxy credentials"
            )
            raise PypiRejected(msg + hint, url=url, status=status)

    def _pause(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff * 2 ** (attempt - 1)
        if retry_after is not None and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), 30.0))
        if delay > 0:
            time.sleep(delay)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


# --- reading METADATA out of a remote zip (wheels PyPI serves no .metadata for) ---


@dataclass(frozen=True, kw_only=True)
class _ZipEntry:
    name: str
    method: int
    compressed_size: int
    header_offset: int


def _central_directory(tail: bytes, *, tail_start: int, url: str) -> tuple[int, int]:
    """(offset, size) of the zip's central directory, from the last bytes of the file."""
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        msg = f"{url}: no zip end-of-central-directory record in the last {len(tail)} bytes"
        raise PypiError(msg)
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack("<IHHHHIIH", tail[at : at + 22])
    if 0xFFFFFFFF not in (cd_size, cd_offset) and count != 0xFFFF:
        return cd_offset, cd_size
    locator = tail.rfind(b"PK\x06\x07", 0, at)
    if locator < 0:
        msg = f"{url}: zip64 archive without a zip64 end-of-central-directory locator"
        raise PypiError(msg)
    record_offset = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0] - tail_start
    if record_offset < 0 or tail[record_offset : record_offset + 4] != b"PK\x06\x06":
        msg = f"{url}: zip64 end-of-central-directory record not found where its locator says"
        raise PypiError(msg)
    cd_size, cd_offset = struct.unpack("<QQ", tail[record_offset + 40 : record_offset + 56])
    return int(cd_offset), int(cd_size)


def _metadata_entry(cd: bytes, *, url: str) -> _ZipEntry:
    """The central-directory entry of the top-level `*.dist-info/METADATA`."""
    pos = 0
    while pos + 46 <= len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
        fields = struct.unpack("<IHHHHHHIIIHHHHHII", cd[pos : pos + 46])
        method, csize, usize = fields[4], fields[8], fields[9]
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        name = cd[pos + 46 : pos + 46 + name_len].decode("utf-8", errors="replace")
        if re.fullmatch(r"[^/]+\.dist-info/METADATA", name):
            extra = cd[pos + 46 + name_len : pos + 46 + name_len + extra_len]
            csize, offset = _zip64_sizes(extra, usize=usize, csize=csize, offset=offset)
            return _ZipEntry(name=name, method=method, compressed_size=csize, header_offset=offset)
        pos += 46 + name_len + extra_len + comment_len
    msg = f"{url}: the wheel has no .dist-info/METADATA in its zip directory"
    raise PypiError(msg)


def _zip64_sizes(extra: bytes, *, usize: int, csize: int, offset: int) -> tuple[int, int]:
    """Compressed size and local-header offset, read from the zip64 extra field when saturated."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[pos : pos + 4])
        if tag == 0x0001:  # zip64: the saturated fields' real values, in this order
            values = iter(struct.unpack(f"<{size // 8}Q", extra[pos + 4 : pos + 4 + size // 8 * 8]))
            if usize == 0xFFFFFFFF:
                next(values, None)
            if csize == 0xFFFFFFFF:
                csize = next(values, csize)
            if offset == 0xFFFFFFFF:
                offset = next(values, offset)
        pos += 4 + size
    return csize, offset


# --- from PyPI's JSON and metadata to facts ---


def _linux_env(python: tuple[int, int]) -> dict[str, str]:
    """Marker environment of CPython `python` on Linux x86_64 (what the wheel is read for)."""
    full = f"{python[0]}.{python[1]}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "platform_python_implementation": "CPython",
        "python_version": f"{python[0]}.{python[1]}",
        "sys_platform": "linux",
        "extra": "",
    }


def _applies(marker: Marker | None, env: dict[str, str]) -> bool:
    if marker is None:
        return True
    if re.search(r"\bextra\b", str(marker)):
        return False  # only what a plain install pulls, never an extra's requirements
    return marker.evaluate(env)


def _exact_pin(req: Requirement, version: str) -> str:
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if len(pins) != 1 or "*" in pins[0]:
        msg = (
            f"{version}: Requires-Dist {req} is not pinned to one version with ==; "
            "the refresh cannot tell which one the wheel installs"
        )
        raise PypiError(msg)
    return pins[0]


def facts_from_metadata(
    metadata: str, *, version: str, python: tuple[int, int]
) -> dict[str, str | None]:
    """CUDA variant, runtime, cuDNN and NCCL pins a wheel's METADATA requires on Linux x86_64."""
    env = _linux_env(python)
    headers = email.parser.HeaderParser().parsestr(metadata)
    runtime: str | None = None
    toolkit: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    for raw in headers.get_all("Requires-Dist") or []:
        try:
            req = Requirement(" ".join(str(raw).split()))
        except InvalidRequirement as exc:
            msg = f"{version}: cannot parse Requires-Dist {raw!r} ({exc})"
            raise PypiError(msg) from exc
        if not _applies(req.marker, env):
            continue
        name = canonicalize_name(req.name)
        if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", name):
            runtime = _exact_pin(req, version)
        elif name == "cuda-toolkit":
            toolkit = _exact_pin(req, version)
        elif re.fullmatch(r"nvidia-cudnn(-cu\d+)?", name):
            cudnn = _exact_pin(req, version)
        elif re.fullmatch(r"nvidia-nccl(-cu\d+)?", name):
            nccl = _exact_pin(req, version)
    cuda_runtime = runtime or toolkit
    if cuda_runtime is None:
        return {"pypi_variant": "cpu", "cuda_runtime": None, "cudnn": cudnn, "nccl": nccl}
    variant = ".".join(cuda_runtime.split(".")[:2])
    return {"pypi_variant": variant, "cuda_runtime": cuda_runtime, "cudnn": cudnn, "nccl": nccl}


def _cpython(filename: str) -> tuple[int, int] | None:
    """(3, 11) for a plain CPython manylinux x86_64 wheel; None for anything else."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    for tag in tags:
        match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
        linux = tag.platform.startswith("manylinux") and tag.platform.endswith("_x86_64")
        if match and tag.abi == tag.interpreter and linux:
            return int(match.group(1)), int(match.group(2))
    return None


def _usable(version: str, oldest: Version | None) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    if parsed.is_prerelease or (oldest is not None and parsed < oldest):
        return None
    return parsed


def fetch_release_facts(
    client: PypiClient, package: str, *, oldest: str | None
) -> dict[str, ReleaseFacts]:
    """Facts of every final, non-yanked release of `package` from `oldest` on, ascending."""
    project_url = client.project_url(package)
    data = client.project(package)
    floor = Version(oldest) if oldest else None
    found: list[tuple[Version, ReleaseFacts]] = []
    for version, raw_files in data["releases"].items():
        parsed = _usable(str(version), floor)
        files = [f for f in raw_files or [] if isinstance(f, dict)]
        if parsed is None or not files or all(f.get("yanked") for f in files):
            continue
        facts = _release_facts(client, project_url, str(version), files)
        found.append((parsed, facts))
    found.sort(key=lambda item: item[0])
    return {facts.version: facts for _, facts in found}


def _release_facts(
    client: PypiClient, project_url: str, version: str, files: list[dict[str, Any]]
) -> ReleaseFacts:
    uploads = sorted(
        str(f.get("upload_time_iso_8601") or f.get("upload_time") or "") for f in files
    )
    released = next((u[:10] for u in uploads if u), None)
    wheels = [
        (py, f)
        for f in files
        if not f.get("yanked") and (py := _cpython(str(f.get("filename", "")))) is not None
    ]
    pythons = tuple(f"{a}.{b}" for a, b in sorted({py for py, _ in wheels}))
    if not wheels:
        log.warning("%s %s has no CPython manylinux x86_64 wheel", project_url, version)
        requires = next(
            (str(f["requires_python"]) for f in files if f.get("requires_python")), None
        )
        return ReleaseFacts(
            version=version,
            released=released,
            requires_python=requires,
            python=(),
            pypi_variant=None,
            cuda_runtime=None,
            cudnn=None,
            nccl=None,
        )

    def nearness(item: tuple[tuple[int, int], dict[str, Any]]) -> tuple[int, int, int, str]:
        (major, minor), f = item
        distance = abs(major - _PREFERRED_PYTHON[0]) * 100 + abs(minor - _PREFERRED_PYTHON[1])
        return distance, major, minor, str(f.get("filename"))

    python, wheel = min(wheels, key=nearness)
    url = urljoin(project_url, str(wheel["url"]))
    log.info("reading %s %s metadata from %s", project_url, version, wheel["filename"])
    pins = facts_from_metadata(client.core_metadata(url), version=version, python=python)
    requires_python = wheel.get("requires_python")
    return ReleaseFacts(
        version=version,
        released=released,
        requires_python=str(requires_python) if requires_python else None,
        python=pythons,
        pypi_variant=pins["pypi_variant"],
        cuda_runtime=pins["cuda_runtime"],
        cudnn=pins["cudnn"],
        nccl=pins["nccl"],
    )


# --- the knowledge file as text: one release block per version, one variant per line ---

_RELEASES_LINE = re.compile(r"releases:\s*(#.*)?")
_TOP_LEVEL = re.compile(r"[^\s#]")
_RELEASE_HEAD = re.compile(r"  (?P<key>\"[^\"]+\"|'[^']+'|[^\s#\"'][^:#]*?):\s*(#.*)?")
_FIELD = re.compile(r"    (?P<key>[A-Za-z_]+):(?P<value>.*)")
_VARIANT = re.compile(r"      (?P<key>\"[^\"]+\"|'[^']+'|[^\s#\"'][^:#]*?):\s*\{.*\}\s*(#.*)?")


def _quote(value: str | None) -> str:
    return "null" if value is None else json.dumps(value)


def _variant_key(cuda: str) -> str:
    return cuda if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", cuda) else _quote(cuda)


def _variant_order(cuda: str) -> tuple[int, Version]:
    try:
        return (0, Version("0")) if cuda == "cpu" else (1, Version(cuda))
    except InvalidVersion:
        return 2, Version("0")


def _pypi_variant_value(facts: ReleaseFacts) -> dict[str, str | None]:
    value: dict[str, str | None] = {"cudnn": facts.cudnn, "nccl": facts.nccl}
    if facts.cuda_runtime is not None:
        value["cuda_runtime"] = facts.cuda_runtime
    value["source"] = PYPI_SOURCE
    return value


def _variant_line(cuda: str, value: Mapping[str, str | None]) -> str:
    body = ", ".join(f"{k}: {v if k == 'source' else _quote(v)}" for k, v in value.items())
    return f"      {_variant_key(cuda)}: {{{body}}}"


def _field_values(facts: ReleaseFacts) -> dict[str, Any]:
    return {
        "released": facts.released,
        "requires_python": facts.requires_python,
        "python": list(facts.python),
        "pypi_variant": facts.pypi_variant,
    }


def _field_line(key: str, value: Any) -> str:
    if isinstance(value, list):
        return f"    {key}: [{', '.join(_quote(str(v)) for v in value)}]"
    return f"    {key}: {_quote(value)}"


def _parse_line(line: str) -> dict[Any, Any] | None:
    """The one-key mapping a single YAML line holds, or None."""
    try:
        data = yaml.safe_load(line.strip())
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) and len(data) == 1 else None


def _release_block(facts: ReleaseFacts, cpu_source: str, newline: str) -> list[str]:
    lines = [f"  {_quote(facts.version)}:", f"    {NEW_RELEASE_COMMENT}"]
    lines += [_field_line(k, v) for k, v in _field_values(facts).items()]
    lines += [f"    source: {PYPI_SOURCE}", "    variants:"]
    if facts.pypi_variant != "cpu":
        lines.append(_variant_line("cpu", {"cudnn": None, "nccl": None, "source": cpu_source}))
    if facts.pypi_variant is not None:
        lines.append(_variant_line(facts.pypi_variant, _pypi_variant_value(facts)))
    return [line + newline for line in lines]


@dataclass(frozen=True, kw_only=True)
class _Block:
    version: str
    start: int  # index of the head line in the file's lines
    end: int  # one past the last line


def _blocks(lines: list[str], name: str) -> tuple[list[_Block], int]:
    """The release blocks and the index where the releases section ends."""
    start = next(
        (i for i, line in enumerate(lines) if _RELEASES_LINE.fullmatch(line.rstrip("\r\n"))),
        None,
    )
    if start is None:
        raise MatrixError([f"{name}: no top-level 'releases:' line"])
    end = next((i for i in range(start + 1, len(lines)) if _TOP_LEVEL.match(lines[i])), len(lines))
    heads: list[tuple[int, str]] = []
    for i in range(start + 1, end):
        text = lines[i].rstrip("\r\n")
        head = _RELEASE_HEAD.fullmatch(text)
        if head:
            heads.append((i, str(yaml.safe_load(head.group("key")))))
        elif text.strip() and not text.lstrip().startswith("#") and not text.startswith("    "):
            raise MatrixError([f"{name}:{i + 1}: expected a release line like '  \"2.4.1\":'"])
    blocks = [
        _Block(version=v, start=i, end=heads[n + 1][0] if n + 1 < len(heads) else end)
        for n, (i, v) in enumerate(heads)
    ]
    return blocks, end


def _update_block(lines: list[str], facts: ReleaseFacts, name: str, newline: str) -> list[str]:
    """The block's lines with exactly the PyPI-derived values replaced where they differ."""
    out = list(lines)
    wanted = _field_values(facts)
    present: dict[str, int] = {}  # field -> index of its line
    for i, line in enumerate(out):
        field = _FIELD.fullmatch(line.rstrip("\r\n"))
        if field and field.group("key") in _FIELDS:
            present[field.group("key")] = i
            if field.group("key") in wanted and not field.group("value").split("#")[0].strip():
                key = field.group("key")
                msg = f"{name}: releases.{facts.version}.{key}: write the value on the same line"
                raise MatrixError([msg])
    if "variants" not in present:
        msg = f"{name}: releases.{facts.version} has no 'variants:' line"
        raise MatrixError([msg])
    for key, value in wanted.items():
        if key in present:
            i = present[key]
            parsed = _parse_line(out[i])
            if parsed is None or parsed.get(key) != value:
                out[i] = _field_line(key, value) + _ending(out[i], newline)
    # Missing fields go before the next field that is present, keeping the usual order.
    for n, key in enumerate(_FIELDS[:4]):
        if key not in present:
            after = [present[k] for k in _FIELDS[n + 1 :] if k in present]
            at = min(after)
            out.insert(at, _field_line(key, wanted[key]) + newline)
            present = {k: (v + 1 if v >= at else v) for k, v in present.items()}
            present[key] = at
    return _update_variants(out, present["variants"], facts, name, newline)


def _ending(line: str, newline: str) -> str:
    return line[len(line.rstrip("\r\n")) :] or newline


def _update_variants(
    lines: list[str], variants_at: int, facts: ReleaseFacts, name: str, newline: str
) -> list[str]:
    out = lines[: variants_at + 1]
    rest = lines[variants_at + 1 :]
    region = 0
    while region < len(rest) and (not rest[region].strip() or rest[region].startswith("      ")):
        region += 1
    wanted = _pypi_variant_value(facts)
    kept: list[tuple[str | None, str]] = []  # (variant or None for comments/blank, line)
    for line in rest[:region]:
        text = line.rstrip("\r\n")
        if not text.strip() or text.lstrip().startswith("#"):
            kept.append((None, line))
            continue
        match = _VARIANT.fullmatch(text)
        parsed = _parse_line(line) if match else None
        value = next(iter(parsed.values())) if parsed else None
        if match is None or not isinstance(value, dict):
            msg = (
                f"{name}: releases.{facts.version}.variants: expected one "
                f"'<cuda>: {{...}}' per line, got {text.strip()!r}"
            )
            raise MatrixError([msg])
        cuda = str(yaml.safe_load(match.group("key")))
        if cuda == facts.pypi_variant:
            if value != wanted:
                line = _variant_line(cuda, wanted) + _ending(line, newline)
            kept.append((cuda, line))
        elif value.get("source") != PYPI_SOURCE:
            kept.append((cuda, line))
        # else: a variant only PyPI vouched for, and PyPI's wheel is now another one: dropped
    if facts.pypi_variant is not None and facts.pypi_variant not in {c for c, _ in kept}:
        new_line = _variant_line(facts.pypi_variant, wanted) + newline
        order = _variant_order(facts.pypi_variant)
        at = next(
            (i for i, (c, _) in enumerate(kept) if c is not None and _variant_order(c) > order),
            None,
        )
        if at is None:
            last = max((i for i, (c, _) in enumerate(kept) if c is not None), default=-1)
            at = last + 1
        kept.insert(at, (facts.pypi_variant, new_line))
    return out + [line for _, line in kept] + rest[region:]


def apply_facts(
    text: str, facts: Mapping[str, ReleaseFacts], *, name: str = "knowledge file"
) -> str:
    """The knowledge file `text` with its PyPI-derived facts replaced by `facts`."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    blocks, section_end = _blocks(lines, name)
    by_version = {b.version: b for b in blocks}
    cpu_source = _newest_cpu_source(lines, blocks)
    out: list[str] = lines[: blocks[0].start if blocks else section_end]
    pending = sorted(
        (f for v, f in facts.items() if v not in by_version), key=lambda f: Version(f.version)
    )
    for block in blocks:
        while pending and Version(pending[0].version) < _safe_version(block.version):
            out += _release_block(pending.pop(0), cpu_source, newline)
        block_lines = lines[block.start : block.end]
        if block.version in facts:
            block_lines = _update_block(block_lines, facts[block.version], name, newline)
        out += block_lines
    for new in pending:
        out += _release_block(new, cpu_source, newline)
    out += lines[section_end:]
    result = "".join(out)
    if not text.endswith(("\n", "\r")) and result == text + newline:
        result = text
    _verify(result, facts, name)
    return result


def _safe_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _newest_cpu_source(lines: list[str], blocks: list[_Block]) -> str:
    """The `source:` of the newest release's cpu variant: where new releases' CPU wheels are."""
    for block in sorted(blocks, key=lambda b: _safe_version(b.version), reverse=True):
        for line in lines[block.start : block.end]:
            if line.startswith("      cpu:"):
                parsed = _parse_line(line)
                if parsed is not None and isinstance(parsed.get("cpu"), dict):
                    return str(parsed["cpu"].get("source", PYPI_SOURCE))
    return PYPI_SOURCE


def _verify(text: str, facts: Mapping[str, ReleaseFacts], name: str) -> None:
    """Refuse to hand back text whose YAML does not say exactly what `facts` say."""
    try:
        releases = (yaml.safe_load(text) or {}).get("releases") or {}
    except (yaml.YAMLError, AttributeError) as exc:
        msg = f"{name}: the refreshed text is not valid YAML ({exc}); nothing written"
        raise EnvbuildError(msg) from exc
    for version, f in facts.items():
        item = releases.get(version) or {}
        got = {k: item.get(k) for k in _field_values(f)}
        variant = (item.get("variants") or {}).get(f.pypi_variant) if f.pypi_variant else None
        if got != _field_values(f) or (f.pypi_variant and variant != _pypi_variant_value(f)):
            msg = (
                f"{name}: releases.{version} does not read back as PyPI's facts after "
                "the update (a bug in envbuild's refresh); nothing written"
            )
            raise EnvbuildError(msg)


def diff(old: str, new: str, name: str) -> list[str]:
    """Unified diff of two versions of a file, one line per item, without line endings."""
    a, b = old.splitlines(), new.splitlines()
    # autojunk off: lines repeated in every release block must still anchor the diff
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    lines: list[str] = []
    for group in matcher.get_grouped_opcodes(3):
        if not lines:
            lines += [f"--- a/{name}", f"+++ b/{name}"]
        first, last = group[0], group[-1]
        old_range = _hunk_range(first[1], last[2])
        new_range = _hunk_range(first[3], last[4])
        lines.append(f"@@ -{old_range} +{new_range} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[i1:i2]]
                continue
            lines += ["-" + line for line in a[i1:i2]]
            lines += ["+" + line for line in b[j1:j2]]
    return lines


def _hunk_range(start: int, stop: int) -> str:
    """A hunk's line range as unified diff writes it (difflib's _format_range_unified)."""
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


def _listed_releases(text: str, path: Path) -> list[str]:
    """The release versions a knowledge file lists, ascending."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MatrixError([f"{path}: not valid YAML: {exc}"]) from exc
    releases = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(releases, dict):
        raise MatrixError([f"{path}: expected a 'releases:' mapping"])
    return sorted((str(v) for v in releases), key=_safe_version)


def refresh(
    framework: str,
    *,
    check: bool,
    client: PypiClient | None = None,
    knowledge_dir: Path | None = None,
) -> RefreshResult:
    """Compare a framework's knowledge file with PyPI; rewrite it unless `check`."""
    package = FRAMEWORK_PACKAGES.get(framework)
    if package is None:
        known = ", ".join(sorted(FRAMEWORK_PACKAGES))
        msg = f"cannot refresh {framework!r}: known frameworks are {known}"
        raise BadInput(msg)
    path = (knowledge_dir or matrices_dir() / "knowledge") / f"{framework}.yaml"
    try:
        old = path.read_bytes().decode("utf-8")  # bytes: keep the file's own line endings
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read the knowledge file: {exc}"
        raise BadInput(msg) from exc
    listed = _listed_releases(old, path)
    oldest = listed[0] if listed else None  # older releases than the file holds stay out
    if client is None:
        with requests.Session() as session:
            facts = fetch_release_facts(PypiClient(session), package, oldest=oldest)
    else:
        facts = fetch_release_facts(client, package, oldest=oldest)
    new = apply_facts(old, facts, name=str(path))
    notes = tuple(
        f"{v}: in {path.name} but PyPI lists no such final, non-yanked release; left as is"
        for v in listed
        if v not in facts
    )
    changed = new != old
    if changed and not check:
        _write_atomically(path, new)
    return RefreshResult(
        changed=changed, diff=tuple(diff(old, new, str(path))), path=path, notes=notes
    )


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` by `text` in one rename, so a reader never sees half a file."""
    temporary: Path | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "wb", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as handle:
            temporary = Path(handle.name)
            handle.write(text.encode("utf-8"))
        temporary.chmod(path.stat().st_mode & 0o7777)
        temporary.replace(path)
    except OSError as exc:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        msg = f"cannot write {path}: {exc}; run with --check to compare without writing"
        raise EnvbuildError(msg) from exc
