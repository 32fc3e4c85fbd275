"""knowledge refresh: facts from recorded PyPI answers, and the line-exact rewrite of torch.yaml."""

from __future__ import annotations

import copy
import io
import json
import shutil
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from envbuild.core.errors import BadInput, MatrixError
from envbuild.knowledge.load import load_knowledge
from envbuild.knowledge.refresh import (
    PypiClient,
    PypiError,
    PypiRejected,
    PypiUnreachable,
    ReleaseFacts,
    apply_facts,
    diff,
    facts_from_metadata,
    fetch_release_facts,
    refresh,
)
from tests.conftest import REPO

RECORDED = Path(__file__).resolve().parent / "recorded"
KNOWLEDGE = REPO / "matrices" / "knowledge"
PROJECT_URL = "https://pypi.org/pypi/torch/json"
WHEEL_211 = "torch-2.1.1-cp311-cp311-manylinux1_x86_64.whl"


@dataclass
class Reply:
    """One scripted answer: a status and body, or an exception raised instead."""

    status: int = 200
    body: bytes = b""
    error: Exception | None = None


@dataclass
class RecordedPypi(BaseAdapter):
    """Answers like PyPI from recorded files; whatever was not recorded is a 404, as on PyPI."""

    project: bytes
    wheels: dict[str, bytes] = field(default_factory=dict)  # served by HTTP range
    metadata: dict[str, str] = field(default_factory=dict)  # extra <wheel>.metadata answers
    script: dict[str, list[Reply]] = field(default_factory=dict)  # url -> answers in turn
    ranges: bool = True
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        url = str(request.url)
        byte_range = request.headers.get("Range")
        self.seen.append((url, byte_range))
        if self.script.get(url):
            reply = self.script[url].pop(0)
            if reply.error is not None:
                raise reply.error
            return _response(request, reply.status, reply.body)
        name = url.rsplit("/", 1)[-1]
        if url == PROJECT_URL:
            return _response(request, 200, self.project)
        if name in self.metadata:
            return _response(request, 200, self.metadata[name].encode())
        if name.endswith(".metadata") and (RECORDED / name).is_file():
            return _response(request, 200, (RECORDED / name).read_bytes())
        if name in self.wheels:
            return self._ranged(request, self.wheels[name], byte_range)
        return _response(request, 404, b"Not Found")

    def _ranged(
        self, request: requests.PreparedRequest, body: bytes, byte_range: str | None
    ) -> requests.Response:
        if byte_range is None or not self.ranges:
            return _response(request, 200, body)
        first, _, last = byte_range.removeprefix("bytes=").partition("-")
        if first:
            start, end = int(first), min(int(last), len(body) - 1)
        else:
            start, end = max(0, len(body) - int(last)), len(body) - 1
        headers = {"Content-Range": f"bytes {start}-{end}/{len(body)}"}
        return _response(request, 206, body[start : end + 1], headers)

    def close(self) -> None:
        pass


def _response(
    request: requests.PreparedRequest,
    status: int,
    body: bytes,
    headers: Mapping[str, str] | None = None,
) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response.reason = {200: "OK", 206: "Partial Content", 404: "Not Found"}.get(status, "")
    response.headers = CaseInsensitiveDict(headers or {})
    response.raw = io.BytesIO(body)
    response.url = str(request.url)
    response.request = request
    return response


def _client(adapter: RecordedPypi) -> PypiClient:
    session = requests.Session()
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return PypiClient(session, backoff=0)


def _project(edit: Any = None) -> bytes:
    data = json.loads((RECORDED / "pypi-torch.json").read_text(encoding="utf-8"))
    if edit is not None:
        edit(data)
    return json.dumps(data).encode()


def _wheel(metadata: str, *, padding_entries: int = 0) -> bytes:
    """A small wheel holding `metadata`; padding entries push its directory past 64 KiB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("torch/__init__.py", "import sys\n" * 200)
        for n in range(padding_entries):
            wheel.writestr(f"torch/include/padding/header_{n:05d}_with_a_long_name.h", "")
        wheel.writestr("torch-2.1.1.dist-info/METADATA", metadata)
        wheel.writestr("torch-2.1.1.dist-info/RECORD", "")
    return buffer.getvalue()


def _as_zip64(data: bytes) -> bytes:
    """The same archive as a zip64 one (saturated fields, zip64 extra and end records)."""
    at = data.rfind(b"PK\x05\x06")
    _, _, _, _, count, cd_size, cd_offset, comment = struct.unpack("<IHHHHIIH", data[at : at + 22])
    entries, pos = [], cd_offset
    while pos < cd_offset + cd_size:
        fields = list(struct.unpack("<IHHHHHHIIIHHHHHII", data[pos : pos + 46]))
        name_len, extra_len, comment_len = fields[10], fields[11], fields[12]
        name = data[pos + 46 : pos + 46 + name_len]
        rest = data[pos + 46 + name_len : pos + 46 + name_len + extra_len + comment_len]
        if name.endswith(b".dist-info/METADATA"):
            usize, csize, offset = fields[9], fields[8], fields[16]
            extra = struct.pack("<HHQQQ", 1, 24, usize, csize, offset)
            fields[8] = fields[9] = fields[16] = 0xFFFFFFFF
            fields[11] += len(extra)
            rest = extra + rest
        entries.append(struct.pack("<IHHHHHHIIIHHHHHII", *fields) + name + rest)
        pos += 46 + name_len + extra_len + comment_len
    directory = b"".join(entries)
    record = struct.pack(
        "<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(directory), cd_offset
    )
    locator = struct.pack("<IIQI", 0x07064B50, 0, cd_offset + len(directory), 1)
    end = struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, comment
    )
    return data[:cd_offset] + directory + record + locator + end


METADATA_211 = (RECORDED / "torch-2.1.1.dist-info-METADATA").read_text(encoding="utf-8")


@pytest.fixture
def pypi() -> RecordedPypi:
    return RecordedPypi(project=_project(), wheels={WHEEL_211: _wheel(METADATA_211)})


def _facts_in_file(text: str) -> dict[str, ReleaseFacts]:
    """ReleaseFacts equal to what a knowledge file already says."""
    facts = {}
    for version, item in yaml.safe_load(text)["releases"].items():
        pypi = item["variants"][item["pypi_variant"]]
        facts[version] = ReleaseFacts(
            version=version,
            released=item["released"],
            requires_python=item["requires_python"],
            python=tuple(item["python"]),
            pypi_variant=item["pypi_variant"],
            cuda_runtime=pypi.get("cuda_runtime"),
            cudnn=pypi["cudnn"],
            nccl=pypi["nccl"],
        )
    return facts


def _changes(lines: list[str]) -> tuple[list[str], list[str]]:
    removed = [line for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line for line in lines if line.startswith("+") and not line.startswith("+++")]
    return removed, added


SHIPPED = (KNOWLEDGE / "torch.yaml").read_text(encoding="utf-8")


# --- facts from recorded PyPI answers ---


def test_facts_from_recorded_pypi(pypi: RecordedPypi) -> None:
    facts = fetch_release_facts(_client(pypi), "torch", oldest="2.0.0")

    assert list(facts) == ["2.1.1", "2.4.1", "2.11.0"]
    assert facts["2.4.1"] == ReleaseFacts(
        version="2.4.1",
        released="2024-09-04",
        requires_python=">=3.8.0",
        python=("3.8", "3.9", "3.10", "3.11", "3.12"),
        pypi_variant="12.1",
        cuda_runtime="12.1.105",
        cudnn="9.1.0.70",
        nccl="2.20.5",
    )
    cuda13 = facts["2.11.0"]  # pins cuda-toolkit[...]==13.0.2, lists cp313t/cp314t wheels too
    assert (cuda13.pypi_variant, cuda13.cuda_runtime) == ("13.0", "13.0.2")
    assert (cuda13.cudnn, cuda13.nccl) == ("9.19.0.56", "2.28.9")
    assert cuda13.python == ("3.10", "3.11", "3.12", "3.13", "3.14")
    no_pep658 = facts["2.1.1"]
    assert (no_pep658.pypi_variant, no_pep658.cudnn, no_pep658.nccl) == (
        "12.1",
        "8.9.2.26",
        "2.18.1",
    )


def test_metadata_missing_on_pypi_is_read_from_the_wheel_by_range(pypi: RecordedPypi) -> None:
    fetch_release_facts(_client(pypi), "torch", oldest="2.0.0")

    wheel_requests = [rng for url, rng in pypi.seen if url.endswith(WHEEL_211)]
    assert wheel_requests, "the 2.1.1 wheel was never read"
    assert all(rng is not None for rng in wheel_requests), "the whole wheel was downloaded"
    assert any(url.endswith(WHEEL_211 + ".metadata") for url, _ in pypi.seen)


@pytest.mark.parametrize(
    "wheel",
    [
        pytest.param(_wheel(METADATA_211), id="small"),
        pytest.param(_wheel(METADATA_211, padding_entries=1200), id="directory-beyond-64k"),
        pytest.param(_as_zip64(_wheel(METADATA_211)), id="zip64"),
    ],
)
def test_range_reader_handles_zip_layouts(wheel: bytes) -> None:
    assert zipfile.ZipFile(io.BytesIO(wheel)).read("torch-2.1.1.dist-info/METADATA")
    pypi = RecordedPypi(project=b"{}", wheels={"t.whl": wheel})

    assert _client(pypi).core_metadata("https://files.example/t.whl") == METADATA_211


def test_a_server_ignoring_ranges_is_an_error_not_a_download() -> None:
    pypi = RecordedPypi(project=b"{}", wheels={"t.whl": _wheel(METADATA_211)}, ranges=False)

    with pytest.raises(PypiError, match=r"https://files.example/t.whl ignored an HTTP range"):
        _client(pypi).core_metadata("https://files.example/t.whl")


def test_prereleases_yanked_and_older_releases_are_skipped() -> None:
    def edit(data: dict[str, Any]) -> None:
        releases = data["releases"]
        for version in ("2.12.0rc1", "1.13.1", "2.4.2"):
            files = copy.deepcopy(releases["2.4.1"])
            for f in files:
                f["filename"] = f["filename"].replace("2.4.1", version)
                f["yanked"] = version == "2.4.2"
            releases[version] = files
        yanked_cp313 = dict(releases["2.4.1"][1], yanked=True)
        yanked_cp313["filename"] = "torch-2.4.1-cp313-cp313-manylinux1_x86_64.whl"
        releases["2.4.1"].append(yanked_cp313)

    pypi = RecordedPypi(project=_project(edit), wheels={WHEEL_211: _wheel(METADATA_211)})
    facts = fetch_release_facts(_client(pypi), "torch", oldest="2.0.0")

    assert list(facts) == ["2.1.1", "2.4.1", "2.11.0"]
    assert "3.13" not in facts["2.4.1"].python
    assert not [u for u, _ in pypi.seen if any(v in u for v in ("2.12.0rc1", "1.13.1", "2.4.2"))]


def test_nearest_cpython_wheel_is_read_when_there_is_no_cp311() -> None:
    def edit(data: dict[str, Any]) -> None:
        data["releases"]["2.4.1"] = [
            f for f in data["releases"]["2.4.1"] if "cp311" not in f["filename"]
        ]

    cp310 = "torch-2.4.1-cp310-cp310-manylinux1_x86_64.whl.metadata"
    recorded = (RECORDED / "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl.metadata").read_text()
    pypi = RecordedPypi(
        project=_project(edit), wheels={WHEEL_211: _wheel(METADATA_211)}, metadata={cp310: recorded}
    )
    facts = fetch_release_facts(_client(pypi), "torch", oldest="2.0.0")

    assert any(url.endswith(cp310) for url, _ in pypi.seen)
    assert facts["2.4.1"].python == ("3.8", "3.9", "3.10", "3.12")
    assert facts["2.4.1"].pypi_variant == "12.1"


def test_only_plain_linux_x86_64_requirements_count() -> None:
    metadata = "\n".join(
        [
            "Metadata-Version: 2.4",
            "Name: torch",
            "Version: 2.99.0",
            "Requires-Dist: nvidia-cuda-runtime-cu12==12.9.1; platform_system == 'Windows'",
            'Requires-Dist: nvidia-cuda-runtime==13.1.80; platform_system == "Linux"',
            'Requires-Dist: nvidia-cudnn-cu13==9.20.0.1; platform_machine == "x86_64"',
            'Requires-Dist: nvidia-cudnn-cu12==8.0.0.1; extra == "cu12"',
            'Requires-Dist: nvidia-nccl-cu13==2.1.1; platform_machine == "aarch64"',
            'Requires-Dist: nvidia-nccl-cu13==2.29.7; sys_platform == "linux"',
            "",
        ]
    )

    assert facts_from_metadata(metadata, version="2.99.0", python=(3, 11)) == {
        "pypi_variant": "13.1",
        "cuda_runtime": "13.1.80",
        "cudnn": "9.20.0.1",
        "nccl": "2.29.7",
    }


def test_a_wheel_without_cuda_pins_is_the_cpu_variant() -> None:
    metadata = "Metadata-Version: 2.1\nName: torch\nRequires-Dist: filelock\n"

    facts = facts_from_metadata(metadata, version="2.99.0", python=(3, 11))

    assert facts == {"pypi_variant": "cpu", "cuda_runtime": None, "cudnn": None, "nccl": None}


def test_an_unpinned_cuda_runtime_is_an_error() -> None:
    metadata = "Name: torch\nRequires-Dist: nvidia-cuda-runtime-cu12>=12.1\n"

    with pytest.raises(PypiError, match=r"2\.99\.0: Requires-Dist nvidia-cuda-runtime-cu12>=12\.1"):
        facts_from_metadata(metadata, version="2.99.0", python=(3, 11))


# --- the client: errors and retries ---


def test_404_fails_at_once_naming_the_url() -> None:
    pypi = RecordedPypi(project=b"{}")
    url = "https://pypi.org/pypi/no-such-package/json"

    with pytest.raises(PypiRejected, match=f"{url} answered HTTP 404") as caught:
        _client(pypi).project("no-such-package")

    assert "check the package name" in caught.value.message
    assert len(pypi.seen) == 1


def test_other_4xx_is_not_retried() -> None:
    pypi = RecordedPypi(project=b"{}", script={PROJECT_URL: [Reply(403), Reply(200)]})

    with pytest.raises(PypiRejected, match="HTTP 403"):
        _client(pypi).project("torch")
    assert len(pypi.seen) == 1


def test_503_then_200_is_retried() -> None:
    pypi = RecordedPypi(project=b"{}", script={PROJECT_URL: [Reply(503), Reply(200, _project())]})

    data = _client(pypi).project("torch")

    assert "2.4.1" in data["releases"]
    assert [url for url, _ in pypi.seen] == [PROJECT_URL, PROJECT_URL]


def test_5xx_every_time_gives_up_after_the_tries() -> None:
    pypi = RecordedPypi(project=b"{}", script={PROJECT_URL: [Reply(502)] * 4})

    with pytest.raises(PypiUnreachable, match=f"{PROJECT_URL} answered HTTP 502 .*4 times"):
        _client(pypi).project("torch")
    assert len(pypi.seen) == 4


def test_connection_errors_are_retried_then_name_the_url_and_the_fix() -> None:
    down = Reply(error=requests.ConnectionError("Name or service not known"))
    pypi = RecordedPypi(project=b"{}", script={PROJECT_URL: [down, down, down, down]})

    with pytest.raises(PypiUnreachable) as caught:
        _client(pypi).project("torch")

    message = caught.value.message
    assert message.startswith(f"cannot reach {PROJECT_URL} after 4 tries: Name or service")
    assert "REQUESTS_CA_BUNDLE" in message
    assert "\n" not in message
    assert len(pypi.seen) == 4


def test_an_answer_that_is_not_json_is_an_error() -> None:
    pypi = RecordedPypi(project=b"<html>proxy login</html>")

    with pytest.raises(PypiError, match=f"{PROJECT_URL} did not return JSON"):
        _client(pypi).project("torch")


# --- apply_facts: the file's text, changed only where PyPI disagrees ---


def test_facts_equal_to_the_file_leave_it_byte_for_byte() -> None:
    assert apply_facts(SHIPPED, _facts_in_file(SHIPPED)) == SHIPPED


def test_recorded_pypi_agrees_with_the_shipped_file(pypi: RecordedPypi) -> None:
    facts = fetch_release_facts(_client(pypi), "torch", oldest="2.0.0")

    assert apply_facts(SHIPPED, facts) == SHIPPED


def test_crlf_files_keep_their_line_endings() -> None:
    crlf = SHIPPED.replace("\n", "\r\n")
    facts = _facts_in_file(SHIPPED)
    facts["2.4.1"] = replace(facts["2.4.1"], nccl="2.20.6")

    new = apply_facts(crlf, facts)

    assert new.count("\r\n") == new.count("\n")
    assert new.replace("\r\n", "\n") == apply_facts(SHIPPED, facts)


def test_a_changed_pin_changes_exactly_that_line() -> None:
    facts = _facts_in_file(SHIPPED)
    facts["2.11.0"] = replace(facts["2.11.0"], cudnn="9.19.1.2")

    new = apply_facts(SHIPPED, facts)

    removed, added = _changes(diff(SHIPPED, new, "torch.yaml"))
    assert removed == [
        '-      "13.0": {cudnn: "9.19.0.56", nccl: "2.28.9", cuda_runtime: "13.0.2", source: pypi}'
    ]
    assert added == [
        '+      "13.0": {cudnn: "9.19.1.2", nccl: "2.28.9", cuda_runtime: "13.0.2", source: pypi}'
    ]
    assert "# 12.8 cuDNN left null" in new


def test_changed_release_fields_change_only_their_lines() -> None:
    facts = _facts_in_file(SHIPPED)
    facts["2.4.1"] = replace(
        facts["2.4.1"], released="2024-09-05", python=("3.9", "3.10", "3.11", "3.12")
    )

    removed, added = _changes(diff(SHIPPED, apply_facts(SHIPPED, facts), "torch.yaml"))

    assert removed == [
        '-    released: "2024-09-04"',
        '-    python: ["3.8", "3.9", "3.10", "3.11", "3.12"]',
    ]
    assert added == ['+    released: "2024-09-05"', '+    python: ["3.9", "3.10", "3.11", "3.12"]']


def test_a_moved_pypi_variant_replaces_the_pypi_line_and_keeps_curated_ones() -> None:
    facts = _facts_in_file(SHIPPED)
    facts["2.4.1"] = replace(
        facts["2.4.1"], pypi_variant="12.4", cuda_runtime="12.4.127", nccl="2.21.5"
    )

    new = apply_facts(SHIPPED, facts)

    release = yaml.safe_load(new)["releases"]["2.4.1"]
    assert release["pypi_variant"] == "12.4"
    assert list(release["variants"]) == ["cpu", "11.8", "12.4"]
    assert release["variants"]["12.4"] == {
        "cudnn": "9.1.0.70",
        "nccl": "2.21.5",
        "cuda_runtime": "12.4.127",
        "source": "pypi",
    }
    assert release["variants"]["11.8"]["source"] == "release-md"


def test_a_new_release_is_added_with_cpu_and_its_pypi_variant(tmp_path: Path) -> None:
    facts = _facts_in_file(SHIPPED)
    facts["2.16.0"] = ReleaseFacts(
        version="2.16.0",
        released="2026-12-09",
        requires_python=">=3.11",
        python=("3.11", "3.12", "3.13", "3.14", "3.15"),
        pypi_variant="13.2",
        cuda_runtime="13.2.3",
        cudnn="9.27.0.1",
        nccl="2.31.1",
    )

    new = apply_facts(SHIPPED, facts)

    assert new.startswith(SHIPPED)
    assert new[len(SHIPPED) :] == (
        '  "2.16.0":\n'
        "    # new: other CUDA variants not yet curated\n"
        '    released: "2026-12-09"\n'
        '    requires_python: ">=3.11"\n'
        '    python: ["3.11", "3.12", "3.13", "3.14", "3.15"]\n'
        '    pypi_variant: "13.2"\n'
        "    source: pypi\n"
        "    variants:\n"
        "      cpu: {cudnn: null, nccl: null, source: download-index}\n"
        '      "13.2": {cudnn: "9.27.0.1", nccl: "2.31.1", cuda_runtime: "13.2.3", source: pypi}\n'
    )
    for path in KNOWLEDGE.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    (tmp_path / "torch.yaml").write_text(new, encoding="utf-8")
    release = load_knowledge(tmp_path).frameworks["torch"].release("2.16.0")
    assert release is not None
    assert [v.cuda for v in release.variants] == ["cpu", "13.2"]


def test_a_new_patch_release_goes_between_its_neighbours() -> None:
    facts = _facts_in_file(SHIPPED)
    facts["2.14.2"] = replace(facts["2.14.1"], version="2.14.2", released="2026-11-20")

    versions = list(yaml.safe_load(apply_facts(SHIPPED, facts))["releases"])

    assert versions[-3:] == ["2.14.1", "2.14.2", "2.15.0"]


def test_a_variant_spread_over_lines_is_refused_with_its_place() -> None:
    text = SHIPPED.replace(
        '      "12.1": {cudnn: "9.1.0.70", nccl: "2.20.5", cuda_runtime: "12.1.105", source: pypi}\n'
        '      "12.4": {cudnn: "9.1.0.70", nccl: null, source: release-md}\n'
        '  "2.5.0":',
        '      "12.1": {cudnn: "9.1.0.70", nccl: "2.20.5", cuda_runtime: "12.1.105", source: pypi}\n'
        '      "12.4":\n        cudnn: "9.1.0.70"\n        nccl: null\n        source: release-md\n'
        '  "2.5.0":',
    )
    assert text != SHIPPED

    with pytest.raises(
        MatrixError, match=r"torch\.yaml: releases\.2\.4\.1\.variants: expected one"
    ):
        apply_facts(text, _facts_in_file(SHIPPED), name="torch.yaml")


# --- refresh: check and write ---


@pytest.fixture
def knowledge_dir(tmp_path: Path) -> Path:
    shutil.copy(KNOWLEDGE / "torch.yaml", tmp_path / "torch.yaml")
    return tmp_path


def test_check_finds_agreement_and_names_releases_pypi_did_not_give(
    pypi: RecordedPypi, knowledge_dir: Path
) -> None:
    result = refresh("torch", check=True, client=_client(pypi), knowledge_dir=knowledge_dir)

    assert not result.changed
    assert result.diff == ()
    assert result.path == knowledge_dir / "torch.yaml"
    assert result.notes[0].startswith("2.0.0: in torch.yaml but PyPI lists no such")


def test_check_reports_a_disagreement_and_writes_nothing(
    pypi: RecordedPypi, knowledge_dir: Path
) -> None:
    path = knowledge_dir / "torch.yaml"
    at = SHIPPED.index('  "2.1.1":')
    wrong = SHIPPED[:at] + SHIPPED[at:].replace('nccl: "2.18.1"', 'nccl: "2.18.3"', 1)
    path.write_text(wrong, encoding="utf-8")

    result = refresh("torch", check=True, client=_client(pypi), knowledge_dir=knowledge_dir)

    assert result.changed
    assert _changes(list(result.diff))[0] == [
        '-      "12.1": {cudnn: "8.9.2.26", nccl: "2.18.3", cuda_runtime: "12.1.105", source: pypi}'
    ]
    assert path.read_text(encoding="utf-8") == wrong


def test_refresh_rewrites_the_file_in_place(pypi: RecordedPypi, knowledge_dir: Path) -> None:
    path = knowledge_dir / "torch.yaml"
    wrong = SHIPPED.replace('released: "2024-09-04"', 'released: "2024-09-01"')
    path.write_text(wrong, encoding="utf-8")
    path.chmod(0o644)

    result = refresh("torch", check=False, client=_client(pypi), knowledge_dir=knowledge_dir)

    assert result.changed
    assert path.read_text(encoding="utf-8") == SHIPPED
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in knowledge_dir.iterdir()) == ["torch.yaml"]


def test_unknown_framework_names_the_known_ones(pypi: RecordedPypi, knowledge_dir: Path) -> None:
    with pytest.raises(BadInput, match=r"cannot refresh 'jax': known frameworks are torch"):
        refresh("jax", check=True, client=_client(pypi), knowledge_dir=knowledge_dir)
    assert pypi.seen == []


def test_refresh_keeps_crlf_line_endings_when_it_writes(
    pypi: RecordedPypi, knowledge_dir: Path
) -> None:
    path = knowledge_dir / "torch.yaml"
    path.write_bytes(SHIPPED.replace('released: "2024-09-04"', 'released: "2024-09-01"').encode())
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))

    assert refresh("torch", check=False, client=_client(pypi), knowledge_dir=knowledge_dir).changed
    assert path.read_bytes() == SHIPPED.replace("\n", "\r\n").encode()
