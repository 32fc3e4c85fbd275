"""`envbuild verify --key` against a registry that serves hostile signatures and attestations:
each case a whole envbuild process, one line and exit 1, bounded by a hang guard. Only the
correctly signed image passes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.core.errors import EXIT_FAILED
from envbuild.publish import cosign
from envbuild.publish.keys import public_pem
from envbuild.registry import DEADLINE_ENV
from tests.support.hostile_registry import (
    OCI_MANIFEST,
    REPOSITORY,
    TAG,
    Answer,
    HostileRegistry,
    Published,
    Seen,
    canonical,
    json_answer,
    sha256,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = ec.generate_private_key(ec.SECP256R1())
OTHER = ec.generate_private_key(ec.SECP256R1())
IMAGE = Published()
DIGEST = sha256(IMAGE.manifest())
OTHER_DIGEST = "sha256:" + "ee" * 32
PASSED = {"result": "PASSED", "passedTests": ["loss_fell"], "failedTests": [], "configuration": []}


@dataclass(frozen=True)
class Signed:
    """The .sig and .att content one case serves: layers as (blob, annotations), or raw bytes."""

    sig_layers: tuple[tuple[bytes, dict[str, str], str], ...] = ()
    att_layers: tuple[tuple[bytes, dict[str, str], str], ...] = ()
    sig_manifest: bytes | None = None  # raw, instead of one made from sig_layers
    att_manifest: bytes | None = None
    missing_blobs: frozenset[str] = field(default_factory=frozenset)

    def manifest(self, layers: tuple[tuple[bytes, dict[str, str], str], ...]) -> bytes:
        config = b"{}"
        return canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": sha256(config),
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": media,
                        "digest": sha256(blob),
                        "size": len(blob),
                        "annotations": notes,
                    }
                    for blob, notes, media in layers
                ],
            }
        )

    def routes(self) -> Callable[[Seen], Answer]:
        tags = {
            cosign.signature_tag(DIGEST): self.sig_manifest
            if self.sig_manifest is not None
            else (self.manifest(self.sig_layers) if self.sig_layers else None),
            cosign.attestation_tag(DIGEST): self.att_manifest
            if self.att_manifest is not None
            else (self.manifest(self.att_layers) if self.att_layers else None),
        }
        blobs = {sha256(b): b for b, _, _ in (*self.sig_layers, *self.att_layers)}
        prefix = f"/v2/{REPOSITORY}/"

        def manifests(seen: Seen) -> Answer:
            body = tags.get(seen.path.split("?")[0].removeprefix(prefix + "manifests/"))
            if body is None:
                return Answer(status=404, body=b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            return json_answer(body, OCI_MANIFEST, **{"Docker-Content-Digest": sha256(body)})

        def blob(seen: Seen) -> Answer:
            digest = seen.path.split("?")[0].removeprefix(prefix + "blobs/")
            if digest in self.missing_blobs or digest not in blobs:
                return Answer(status=404, body=b'{"errors":[{"code":"BLOB_UNKNOWN"}]}')
            return Answer(headers={"Content-Type": "application/octet-stream"}, body=blobs[digest])

        overrides: dict[str, Callable[[Seen], Answer]] = {
            r"/manifests/sha256-[0-9a-f]+\.(sig|att)$": manifests
        }
        for digest in blobs:
            overrides[rf"/blobs/{digest}$"] = blob
        return IMAGE.routes(**overrides)


def signature(
    payload: bytes, key: ec.EllipticCurvePrivateKey = KEY, sig: str | None = None
) -> tuple[bytes, dict[str, str], str]:
    annotation = sig if sig is not None else cosign.sign(key, payload)
    return payload, {cosign.SIGNATURE_ANNOTATION: annotation}, cosign.SIMPLE_SIGNING_MEDIA_TYPE


def attestation(
    predicate_type: str,
    predicate: dict[str, Any],
    *,
    key: ec.EllipticCurvePrivateKey = KEY,
    digest: str = DIGEST,
    payload_type: str = cosign.IN_TOTO_PAYLOAD_TYPE,
) -> tuple[bytes, dict[str, str], str]:
    statement = cosign.Statement(
        subject_name="x", digest=digest, predicate_type=predicate_type, predicate=predicate
    )
    body = canonical(statement.as_dict())
    envelope = canonical(
        {
            "payload": base64.b64encode(body).decode(),
            "payloadType": payload_type,
            "signatures": [{"keyid": "", "sig": cosign.sign(key, cosign.pae(payload_type, body))}],
        }
    )
    notes = {cosign.SIGNATURE_ANNOTATION: "", cosign.PREDICATE_TYPE_ANNOTATION: predicate_type}
    return envelope, notes, cosign.DSSE_MEDIA_TYPE


GOOD_PAYLOAD = cosign.simple_signing_payload(f"127.0.0.1/{REPOSITORY}", DIGEST)
GOOD_ATTESTATIONS = (
    attestation(cosign.TEST_RESULT, PASSED),
    attestation(cosign.SLSA_PROVENANCE, {}),
    attestation(cosign.CYCLONEDX, {}),
)
GOOD = Signed(sig_layers=(signature(GOOD_PAYLOAD),), att_layers=GOOD_ATTESTATIONS)


def hostile_cases() -> dict[str, tuple[Signed, str]]:
    """Each way the signed content can be wrong, with the words of its one line."""
    critical = json.loads(GOOD_PAYLOAD)["critical"]
    extra_field = canonical({"critical": critical, "optional": None, "extra": 1})
    der = base64.b64decode(cosign.sign(KEY, GOOD_PAYLOAD))
    replaced_atts = lambda *layers: replace(GOOD, att_layers=layers)  # noqa: E731
    return {
        "unsigned": (Signed(), "is not signed"),
        "another digest": (
            replace(GOOD, sig_layers=(signature(cosign.simple_signing_payload("x/y", OTHER_DIGEST)),)),
            f"is for {OTHER_DIGEST}",
        ),
        "an extra payload field": (replace(GOOD, sig_layers=(signature(extra_field),)), "simple-signing"),
        "another key": (replace(GOOD, sig_layers=(signature(GOOD_PAYLOAD, OTHER),)), "does not verify"),
        "a truncated signature": (
            replace(GOOD, sig_layers=(signature(GOOD_PAYLOAD, sig=base64.b64encode(der[:30]).decode()),)),
            "does not verify",
        ),
        "a signature that is not DER": (
            replace(GOOD, sig_layers=(signature(GOOD_PAYLOAD, sig=base64.b64encode(os.urandom(71)).decode()),)),
            "does not verify",
        ),
        "a signature that is not base64": (
            replace(GOOD, sig_layers=(signature(GOOD_PAYLOAD, sig="%%% not base64"),)),
            "not standard base64",
        ),
        "no signature annotation": (
            replace(GOOD, sig_layers=((GOOD_PAYLOAD, {}, cosign.SIMPLE_SIGNING_MEDIA_TYPE),)),
            "without a signature annotation",
        ),
        "10,000 signatures": (replace(GOOD, sig_layers=(signature(GOOD_PAYLOAD),) * 10_000), "holds 10000 layers"),
        "a huge payload": (
            replace(GOOD, sig_layers=(signature(b"{" + b" " * (2 << 20) + b"}"),)),
            "",
        ),
        "a missing payload blob": (replace(GOOD, missing_blobs=frozenset({sha256(GOOD_PAYLOAD)})), ""),
        "a signature manifest that is an index": (
            replace(GOOD, sig_manifest=canonical({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []})),
            "signature manifest",
        ),
        "a signature manifest that is not JSON": (replace(GOOD, sig_manifest=b"\x00not json"), "malformed"),
        "no attestations": (replace(GOOD, att_layers=()), "none is attached"),
        "an envelope of another payload type": (
            replaced_atts(attestation(cosign.TEST_RESULT, PASSED, payload_type="text/plain"), *GOOD_ATTESTATIONS[1:]),
            "payload type is 'text/plain'",
        ),
        "a statement about another image": (
            replaced_atts(attestation(cosign.TEST_RESULT, PASSED, digest=OTHER_DIGEST), *GOOD_ATTESTATIONS[1:]),
            "another image",
        ),
        "an attestation by another key": (
            replaced_atts(attestation(cosign.TEST_RESULT, PASSED, key=OTHER), *GOOD_ATTESTATIONS[1:]),
            "no signature of the envelope verifies",
        ),
        "a FAILED verdict": (
            replaced_atts(attestation(cosign.TEST_RESULT, {**PASSED, "result": "FAILED", "failedTests": ["allreduce"]}),
                          *GOOD_ATTESTATIONS[1:]),
            "verdict is FAILED",
        ),
        "no provenance": (replaced_atts(GOOD_ATTESTATIONS[0], GOOD_ATTESTATIONS[2]), "slsa.dev/provenance/v1"),
        "10,000 attestations": (replaced_atts(*(GOOD_ATTESTATIONS * 3334)), "more than envbuild reads"),
    }  # fmt: skip


CASES = list(hostile_cases())


def verify_with_key(host: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    public = tmp_path / "envbuild.pub"
    public.write_bytes(public_pem(KEY.public_key()))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({DEADLINE_ENV: "30", "DOCKER_CONFIG": str(tmp_path), "NO_PROXY": "127.0.0.1"})
    return subprocess.run(
        [sys.executable, "-m", "envbuild", "verify", f"{host}/{REPOSITORY}:{TAG}", "--key", str(public)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def test_the_correctly_signed_image_verifies(tmp_path: Path) -> None:
    with HostileRegistry(GOOD.routes()) as server:
        result = verify_with_key(server.host, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the signed smoke verdict is PASSED" in result.stdout


@pytest.mark.parametrize("case", CASES)
def test_hostile_signed_content_is_one_line_and_exit_1(case: str, tmp_path: Path) -> None:
    signed, words = hostile_cases()[case]
    with HostileRegistry(signed.routes()) as server:
        result = verify_with_key(server.host, tmp_path)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("envbuild: error:")]
    assert len(errors) == 1, result.stderr
    assert result.returncode == EXIT_FAILED, result.stderr
    assert words in errors[0]
