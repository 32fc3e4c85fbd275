"""Signing keys: ECDSA P-256, the one scheme cosign's key-based signatures require.

The private key is a PKCS#8 PEM encrypted with a password; both come from the environment
(ENVBUILD_SIGNING_KEY: a file, or the PEM itself; ENVBUILD_SIGNING_PASSWORD), never from an
argument, and both are registered with the redactor the moment they are read. The public key is
a PEM SubjectPublicKeyInfo, the form `cosign verify --key`, Kyverno and skopeo read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.core.errors import BadInput
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file
from envbuild.core.names import shown
from envbuild.core.redact import register

KEY_ENV = "ENVBUILD_SIGNING_KEY"
PASSWORD_ENV = "ENVBUILD_SIGNING_PASSWORD"
MAX_KEY_BYTES = 64 * 1024  # a P-256 PEM is under 1 KB; anything near this is not a key
_PEM_START = "-----BEGIN "
_GENERATE = "make one with `envbuild keys generate --out envbuild.key`"


@dataclass(frozen=True)
class SigningKey:
    """A loaded private key and where it came from (for messages, never its bytes)."""

    private: ec.EllipticCurvePrivateKey
    source: str

    @property
    def public(self) -> ec.EllipticCurvePublicKey:
        """The key's public half."""
        return self.private.public_key()


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    """The public key as PEM SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`)."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def generate_key(out: Path, password: str, *, force: bool = False) -> Path:
    """Write a new encrypted P-256 key to `out` (mode 0600) and its public key beside it as
    `<out without suffix>.pub`; returns the public key's path. Refuses to overwrite either
    file unless `force`."""
    if not password:
        msg = f"{PASSWORD_ENV} is empty; set it to the password that will protect {out}"
        raise BadInput(msg)
    register(password)
    public_path = check_key_paths(out, force=force)
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode("utf-8")),
    )
    _register_pem(pem.decode("ascii"))
    try:
        _write_new(out, pem, 0o600)
        _write_new(public_path, public_pem(private.public_key()), 0o644)
    except OSError as exc:
        out.unlink(missing_ok=True)
        msg = (
            f"cannot write {shown(str(exc.filename or out))}: {exc.strerror}; pass a writable --out"
        )
        raise BadInput(msg) from None
    return public_path


def check_key_paths(out: Path, *, force: bool = False) -> Path:
    """The public key's path beside `out`, once neither file is there to be overwritten (or
    `force`); a command asks for a password only after this."""
    if out.suffix == ".pub":
        # The public key would be written over the private one: the private key would be lost.
        msg = (
            f"--out {shown(str(out))} is the public key's name; name the private key "
            "(e.g. --out envbuild.key) and its .pub goes beside it"
        )
        raise BadInput(msg)
    public_path = out.with_suffix(".pub")
    for path in (out, public_path):
        if not force and (path.exists() or path.is_symlink()):
            msg = f"{shown(str(path))} already exists; pass --force to replace it, or another --out"
            raise BadInput(msg)
    return public_path


def load_signing_key(environ: Mapping[str, str] | None = None) -> SigningKey:
    """The private key ENVBUILD_SIGNING_KEY names (a file or the PEM), opened with
    ENVBUILD_SIGNING_PASSWORD; BadInput in one line for anything else."""
    env = os.environ if environ is None else environ
    value = env.get(KEY_ENV, "")
    password = env.get(PASSWORD_ENV)
    register(password)
    if not value.strip():
        msg = f"--sign needs a key: set {KEY_ENV} to the key file (or its PEM); {_GENERATE}"
        raise BadInput(msg)
    if value.lstrip().startswith(_PEM_START):
        _register_pem(value)
        source, data = f"{KEY_ENV} (the PEM in the environment)", value.encode("utf-8", "replace")
    else:
        source = f"{KEY_ENV}={shown(value)}"
        data = _read_key_file(Path(value), source, f"point {KEY_ENV} at the private key file")
        _register_pem(data.decode("ascii", "replace"))
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        msg = f"{source} is a public key; signing needs the private key (the file without .pub)"
        raise BadInput(msg)
    try:
        private = serialization.load_pem_private_key(
            data, password.encode("utf-8") if password else None
        )
    except TypeError:
        # cryptography says which: a password for a plain key, or none for an encrypted one.
        if password:
            msg = f"{source} is not encrypted; unset {PASSWORD_ENV}, or {_GENERATE}"
        else:
            msg = f"{source} is encrypted; set {PASSWORD_ENV} to its password"
        raise BadInput(msg) from None
    except ValueError:
        msg = (
            f"{source}: wrong password in {PASSWORD_ENV}, or not a PEM private key; "
            f"check both, or {_GENERATE}"
        )
        raise BadInput(msg) from None
    except UnsupportedAlgorithm:
        msg = f"{source}: unsupported key type; signatures need an ECDSA P-256 key; {_GENERATE}"
        raise BadInput(msg) from None
    if not isinstance(private, ec.EllipticCurvePrivateKey) or not isinstance(
        private.curve, ec.SECP256R1
    ):
        kind = _kind(private)
        msg = f"{source} is {kind}; signatures need an ECDSA P-256 key; {_GENERATE}"
        raise BadInput(msg)
    return SigningKey(private=private, source=source)


def load_public_key(path: Path, *, option: str = "--key") -> ec.EllipticCurvePublicKey:
    """The P-256 public key in the PEM file at `path`; BadInput in one line otherwise."""
    source = f"{option} {shown(str(path))}"
    data = _read_key_file(path, source, f"pass the public key file ({option} envbuild.pub)")
    if b"PRIVATE KEY" in data:
        msg = f"{source} is a private key; pass its public key (the .pub file beside it)"
        raise BadInput(msg)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        msg = f"{source} holds no PEM public key; pass the .pub file `envbuild keys generate` wrote"
        raise BadInput(msg) from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        msg = f"{source} is {_kind(key)}; envbuild signs with ECDSA P-256 keys only"
        raise BadInput(msg)
    return key


def _kind(key: object) -> str:
    """A key's type in words, for messages."""
    curve = getattr(key, "curve", None)
    if curve is not None:
        return f"an elliptic-curve key on {curve.name}"
    name = type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "")
    article = "an" if name[:1] in ("A", "E", "I", "O", "R", "X") else "a"
    return f"{article} {name} key" if name else "a different kind of key"


def _read_key_file(path: Path, source: str, fix: str) -> bytes:
    try:
        return read_small_file(path, MAX_KEY_BYTES)
    except FileNotFoundError:
        msg = f"{source}: no such file; {fix}"
    except NotRegularFile as exc:
        msg = f"{source} is {exc.kind}; {fix}"
    except FileTooLarge:
        msg = f"{source} is over {MAX_KEY_BYTES // 1024} KiB, too large for a key; {fix}"
    except (OSError, ValueError) as exc:
        msg = f"{source}: cannot read it ({getattr(exc, 'strerror', None) or exc}); {fix}"
    raise BadInput(msg)


def _register_pem(text: str) -> None:
    """Register a PEM and each line of its body: a leak may show it whole or a line at a time."""
    register(text, text.strip())
    body = [line.strip() for line in text.splitlines() if line and not line.startswith("-----")]
    register("".join(body), *body)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a new file at `path` with `mode` from its creation (no window of 0644)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
