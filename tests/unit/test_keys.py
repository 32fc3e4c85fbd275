"""Signing keys: generated, loaded from a file or the environment, and every wrong key one line."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from envbuild.core.errors import BadInput
from envbuild.core.redact import redact
from envbuild.publish import cosign
from envbuild.publish.keys import (
    KEY_ENV,
    PASSWORD_ENV,
    generate_key,
    load_public_key,
    load_signing_key,
)

PASSWORD = "correct horse battery staple"


@pytest.fixture
def key_pair(tmp_path: Path) -> tuple[Path, Path]:
    private = tmp_path / "envbuild.key"
    return private, generate_key(private, PASSWORD)


def test_a_generated_key_signs_what_its_public_key_verifies(key_pair: tuple[Path, Path]) -> None:
    private, public = key_pair
    assert public == private.with_suffix(".pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"ENCRYPTED PRIVATE KEY" in private.read_bytes()
    key = load_signing_key({KEY_ENV: str(private), PASSWORD_ENV: PASSWORD})
    signature = cosign.sign(key.private, b"payload")
    cosign.verify_signature(load_public_key(public), b"payload", signature)


def test_the_key_may_be_the_pem_itself(key_pair: tuple[Path, Path]) -> None:
    private, _ = key_pair
    key = load_signing_key({KEY_ENV: private.read_text(), PASSWORD_ENV: PASSWORD})
    assert "PEM in the environment" in key.source


def test_the_key_and_its_password_are_redacted_once_read(key_pair: tuple[Path, Path]) -> None:
    private, _ = key_pair
    load_signing_key({KEY_ENV: str(private), PASSWORD_ENV: PASSWORD})
    pem = private.read_text()
    leaked = redact(f"oops {pem} and {PASSWORD}")
    assert PASSWORD not in leaked
    for line in pem.splitlines():
        if not line.startswith("-----"):
            assert line not in leaked


def test_generate_refuses_to_overwrite(key_pair: tuple[Path, Path]) -> None:
    private, _ = key_pair
    before = private.read_bytes()
    with pytest.raises(BadInput, match="already exists; pass --force"):
        generate_key(private, PASSWORD)
    assert private.read_bytes() == before
    generate_key(private, PASSWORD, force=True)
    assert private.read_bytes() != before


def test_generate_needs_a_password(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=f"{PASSWORD_ENV} is empty"):
        generate_key(tmp_path / "k.key", "")
    assert list(tmp_path.iterdir()) == []


def _pem(key: object, password: bytes | None) -> bytes:
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def wrong_keys(tmp_path: Path, good: Path) -> dict[str, tuple[dict[str, str], str]]:
    """Environments that must not give a signing key, with the words of the one-line reason."""

    def write(name: str, data: bytes) -> str:
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)

    p256 = ec.generate_private_key(ec.SECP256R1())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {
        "unset": ({}, f"set {KEY_ENV}"),
        "blank": ({KEY_ENV: "  "}, f"set {KEY_ENV}"),
        "wrong password": (
            {KEY_ENV: str(good), PASSWORD_ENV: "not-the-password-7f3a"},
            "wrong password",
        ),
        "no password": ({KEY_ENV: str(good)}, f"is encrypted; set {PASSWORD_ENV}"),
        "plain key with a password": (
            {KEY_ENV: write("plain.key", _pem(p256, None)), PASSWORD_ENV: "x"},
            "is not encrypted",
        ),
        "rsa": (
            {
                KEY_ENV: write("rsa.key", _pem(rsa.generate_private_key(65537, 2048), b"pw")),
                PASSWORD_ENV: "pw",
            },
            "need an ECDSA P-256 key",
        ),
        "p384": (
            {
                KEY_ENV: write("p384.key", _pem(ec.generate_private_key(ec.SECP384R1()), b"pw")),
                PASSWORD_ENV: "pw",
            },
            "secp384r1",
        ),
        "ed25519": (
            {
                KEY_ENV: write("ed.key", _pem(ed25519.Ed25519PrivateKey.generate(), b"pw")),
                PASSWORD_ENV: "pw",
            },
            "need an ECDSA P-256 key",
        ),
        "public key": ({KEY_ENV: str(good.with_suffix(".pub"))}, "is a public key"),
        "missing file": ({KEY_ENV: str(tmp_path / "absent.key")}, "no such file"),
        "directory": ({KEY_ENV: str(tmp_path)}, "is a directory"),
        "fifo": ({KEY_ENV: str(fifo)}, "named pipe"),
        "huge": ({KEY_ENV: write("huge.key", b"A" * (1 << 20))}, "too large for a key"),
        "garbage": ({KEY_ENV: write("garbage.key", b"\x00\xff" * 100)}, "not a PEM private key"),
        "garbage pem": ({KEY_ENV: "-----BEGIN PRIVATE KEY-----\nAAAA\n"}, "not a PEM private key"),
    }


CASES = [
    "unset", "blank", "wrong password", "no password", "plain key with a password", "rsa",
    "p384", "ed25519", "public key", "missing file", "directory", "fifo", "huge", "garbage",
    "garbage pem",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_signing_key_is_one_line(
    case: str, key_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    env, reason = wrong_keys(tmp_path, key_pair[0])[case]
    with pytest.raises(BadInput, match=reason) as caught:
        load_signing_key(env)
    assert "\n" not in caught.value.message
    assert PASSWORD not in caught.value.message


def wrong_public_keys(tmp_path: Path, pair: tuple[Path, Path]) -> dict[str, tuple[Path, str]]:
    """Files that are not a P-256 public key, with the words of the reason."""

    def write(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path

    def public(key: object) -> bytes:
        return key.public_key().public_bytes(  # type: ignore[attr-defined,no-any-return]
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    return {
        "private key": (pair[0], "is a private key"),
        "rsa": (write("rsa.pub", public(rsa.generate_private_key(65537, 2048))), "P-256 keys only"),
        "p521": (write("p521.pub", public(ec.generate_private_key(ec.SECP521R1()))), "secp521r1"),
        "empty": (write("empty.pub", b""), "holds no PEM public key"),
        "missing": (tmp_path / "absent.pub", "no such file"),
    }


@pytest.mark.parametrize("case", ["private key", "rsa", "p521", "empty", "missing"])
def test_a_wrong_public_key_is_one_line(
    case: str, key_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    path, reason = wrong_public_keys(tmp_path, key_pair)[case]
    with pytest.raises(BadInput, match=reason) as caught:
        load_public_key(path)
    assert "\n" not in caught.value.message


def test_a_key_file_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    target: Callable[[], Path] = lambda: folder / "k.key"  # noqa: E731
    (folder / "k.pub").mkdir()  # the public key's place is taken by a folder
    with pytest.raises(BadInput):
        generate_key(target(), PASSWORD, force=True)
    assert not target().exists()


def test_a_private_key_named_like_its_public_key_is_refused(tmp_path: Path) -> None:
    # The public key's .pub would be written over the private key, losing it.
    with pytest.raises(BadInput, match="is the public key's name"):
        generate_key(tmp_path / "envbuild.pub", PASSWORD)
    assert list(tmp_path.iterdir()) == []
