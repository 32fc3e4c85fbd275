"""What envbuild attests about a published image, as in-toto predicates: the smoke verdict
(test-result v0.1), how the image was built (SLSA provenance v1) and what it holds (CycloneDX).

Each predicate holds exactly the fields its protobuf schema defines (the admission controllers
parse them strictly); tests round-trip them through the in-toto-attestation bindings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from envbuild import __version__
from envbuild.core import labels as label_keys

BUILD_TYPE = "urn:envbuild:build-type:image:v1"
BUILDER_ID = "urn:envbuild:builder"
PASSED, FAILED = "PASSED", "FAILED"
MAX_TESTS = 256  # a smoke report has a few dozen checks

# The labels that name what was asked for: the entry's axes (external parameters).
_PARAMETER_LABELS = {
    "entry": label_keys.ENTRY_ID,
    "framework": label_keys.FRAMEWORK,
    "frameworkVersion": label_keys.FRAMEWORK_VERSION,
    "cuda": label_keys.CUDA,
    "cudnn": label_keys.CUDNN,
    "nccl": label_keys.NCCL,
    "python": label_keys.PYTHON,
    "os": label_keys.OS,
    "user": label_keys.USER,
}


def test_result(report: Mapping[str, Any], *, payload_digest: str | None) -> dict[str, Any]:
    """The test-result predicate of a recorded smoke report: PASSED only when every host check
    passed; the checks by name; the payload, the run options and the devices as configuration."""
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)][:MAX_TESTS]
    passed = [str(c.get("name")) for c in checks if c.get("passed") is True]
    failed = [str(c.get("name")) for c in checks if c.get("passed") is not True]
    verdict = PASSED if report.get("passed") is True and checks and not failed else FAILED
    payload: dict[str, Any] = {"name": "envbuild smoke payload"}
    if payload_digest:
        payload["digest"] = {"sha256": payload_digest.removeprefix("sha256:")}
    devices = [
        {k: v for k, v in d.items() if isinstance(v, str | int | float | bool)}
        for d in report.get("devices") or []
        if isinstance(d, dict)
    ]
    configuration = [
        payload,
        {"name": "docker run", "annotations": {"options": str(report.get("run_with") or "")}},
        {"name": "devices", "annotations": {"devices": devices}},
    ]
    return {
        "result": verdict,
        "configuration": configuration,
        "passedTests": passed,
        "warnedTests": [],
        "failedTests": failed,
    }


@dataclass(frozen=True, kw_only=True)
class BuildFacts:
    """What envbuild recorded when it built an image, for its provenance."""

    image_id: str
    labels: Mapping[str, str]
    base_image: str | None = None  # the reference the build started FROM
    base_image_id: str | None = None
    dockerfile_sha256: str | None = None
    installer: str | None = None  # e.g. "uv 0.11.2"
    started: datetime | None = None
    finished: datetime | None = None
    invocation: str | None = None  # the run's id


def build_facts(
    image_id: str, labels: Mapping[str, str], recorded: Mapping[str, Any]
) -> BuildFacts:
    """BuildFacts from the image's labels and what the build recorded (ResultStore.provenance);
    a recorded value of the wrong type is left out, never trusted."""

    def text(key: str) -> str | None:
        value = recorded.get(key)
        return value if isinstance(value, str) and value else None

    def moment(key: str) -> datetime | None:
        value = text(key)
        try:
            return datetime.fromisoformat(value) if value else None
        except ValueError:
            return None

    return BuildFacts(
        image_id=image_id,
        labels=labels,
        base_image=text("base_image"),
        base_image_id=text("base_image_id"),
        dockerfile_sha256=text("dockerfile_sha256"),
        installer=text("installer"),
        started=moment("started"),
        finished=moment("finished"),
        invocation=text("invocation"),
    )


def provenance(facts: BuildFacts) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of an image envbuild built."""
    labels = facts.labels
    parameters = {
        key: labels[label] for key, label in _PARAMETER_LABELS.items() if labels.get(label)
    }
    dependencies: list[dict[str, Any]] = []
    if facts.base_image_id:
        base = {"name": "base image", "digest": {"sha256": _hex(facts.base_image_id)}}
        if facts.base_image:
            base["uri"] = f"docker-image:{facts.base_image}"
        dependencies.append(base)
    lock = labels.get(label_keys.LOCK_DIGEST)
    if lock:
        dependencies.append({"name": "envbuild.lock", "digest": {"sha256": _hex(lock)}})
    if facts.dockerfile_sha256:
        dependencies.append(
            {"name": "Dockerfile", "digest": {"sha256": _hex(facts.dockerfile_sha256)}}
        )
    if facts.installer:
        dependencies.append({"name": "installer", "annotations": {"version": facts.installer}})
    version = labels.get(label_keys.VERSION) or __version__
    metadata: dict[str, Any] = {}
    if facts.invocation:
        metadata["invocationId"] = facts.invocation
    if facts.started:
        metadata["startedOn"] = _rfc3339(facts.started)
    if facts.finished:
        metadata["finishedOn"] = _rfc3339(facts.finished)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": parameters,
            "internalParameters": {"contentHash": labels.get(label_keys.CONTENT_HASH) or ""},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"envbuild": version}},
            "metadata": metadata,
            "byproducts": [{"name": "image config", "digest": {"sha256": _hex(facts.image_id)}}],
        },
    }


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _rfc3339(moment: datetime) -> str:
    """UTC, seconds, `Z`: what protobuf's Timestamp JSON parser accepts."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def index_test_result(children: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The test-result predicate of an image index: PASSED, as an index is published only over
    images whose own signed verdicts are PASSED; each platform's image as configuration (by
    digest), where its own verdict and checks are attested."""
    return {
        "result": PASSED,
        "configuration": [
            {"name": platform, "digest": {"sha256": _hex(digest)}} for platform, digest in children
        ],
        "passedTests": [platform for platform, _ in children],
        "warnedTests": [],
        "failedTests": [],
    }


def index_provenance(children: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of an image index envbuild made over its images."""
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"platforms": ",".join(p for p, _ in children)},
            "internalParameters": {},
            "resolvedDependencies": [
                {"name": f"{platform} image", "digest": {"sha256": _hex(digest)}}
                for platform, digest in children
            ],
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"envbuild": __version__}},
            "metadata": {},
        },
    }
