"""`envbuild keys generate` and `envbuild policy` from the command line: the password from the
environment or a real terminal, never an argument; every mistake one line and exit 2; and no
password or private key in anything they print."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from envbuild.cli.main import main
from envbuild.publish.keys import PASSWORD_ENV, public_pem

PASSWORD = "hunter2 is not a password"
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, password: str | None = PASSWORD) -> tuple[int, str, str]:
    env = {PASSWORD_ENV: password}  # None unsets it for the run
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("envbuild: error: ")
    assert "Traceback" not in err
    return lines[0]


def secrets_of(private: Path) -> list[str]:
    """What must never be printed: the password and each line of the private key's body."""
    body = [line for line in private.read_text().splitlines() if not line.startswith("-----")]
    assert body
    return [PASSWORD, *body]


def assert_no_secret(private: Path, *outputs: str) -> None:
    for secret in secrets_of(private):
        for output in outputs:
            assert secret not in output


@pytest.fixture
def key_pair(tmp_path: Path) -> tuple[Path, Path]:
    private = tmp_path / "envbuild.key"
    code, _, err = run("keys", "generate", "--out", str(private))
    assert code == 0, err
    return private, tmp_path / "envbuild.pub"


def test_keys_generate_takes_the_password_from_the_environment(
    key_pair: tuple[Path, Path],
) -> None:
    private, public = key_pair
    assert b"ENCRYPTED PRIVATE KEY" in private.read_bytes()
    assert b"BEGIN PUBLIC KEY" in public.read_bytes()
    private_key = serialization.load_pem_private_key(private.read_bytes(), PASSWORD.encode())
    assert isinstance(private_key, ec.EllipticCurvePrivateKey)
    assert public_pem(private_key.public_key()) == public.read_bytes()


def test_keys_generate_says_where_the_keys_went_and_nothing_secret(tmp_path: Path) -> None:
    private = tmp_path / "team.key"
    code, out, err = run("keys", "generate", "--out", str(private))
    assert code == 0, err
    assert f"private key: {private}" in out
    assert f"public key:  {tmp_path / 'team.pub'}" in out
    assert_no_secret(private, out, err)


def test_keys_generate_without_a_password_and_no_terminal_is_one_line(tmp_path: Path) -> None:
    code, out, err = run("keys", "generate", "--out", str(tmp_path / "k.key"), password=None)
    assert code == 2
    assert out == ""
    line = one_error_line(err)
    assert PASSWORD_ENV in line
    assert "at a terminal" in line
    assert list(tmp_path.iterdir()) == []


def test_keys_generate_with_an_empty_password_is_one_line(tmp_path: Path) -> None:
    code, _, err = run("keys", "generate", "--out", str(tmp_path / "k.key"), password="")
    assert code == 2
    assert f"{PASSWORD_ENV} is empty" in one_error_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["envbuild.key", "envbuild.pub", "both"])
@pytest.mark.parametrize("what", ["file", "folder", "dangling link"])
def test_keys_generate_never_touches_what_is_already_there(
    tmp_path: Path, existing: str, what: str
) -> None:
    names = ["envbuild.key", "envbuild.pub"] if existing == "both" else [existing]
    for name in names:
        path = tmp_path / name
        if what == "file":
            path.write_text("precious\n")
        elif what == "folder":
            path.mkdir()
        else:
            path.symlink_to(tmp_path / "nowhere")
    before = {
        p.name: (p.is_symlink(), p.is_dir(), p.is_file() and p.read_text())
        for p in tmp_path.iterdir()
    }
    # No password either: the refusal must come before anything is asked or written.
    code, _, err = run("keys", "generate", "--out", str(tmp_path / "envbuild.key"), password=None)
    assert code == 2
    assert "already exists; pass --force" in one_error_line(err)
    after = {
        p.name: (p.is_symlink(), p.is_dir(), p.is_file() and p.read_text())
        for p in tmp_path.iterdir()
    }
    assert after == before


def test_keys_generate_force_replaces_a_key(key_pair: tuple[Path, Path]) -> None:
    private, public = key_pair
    before = public.read_bytes()
    code, _, err = run("keys", "generate", "--out", str(private), "--force")
    assert code == 0, err
    assert public.read_bytes() != before


def test_keys_generate_refuses_an_out_that_would_be_replaced_by_its_own_public_key(
    tmp_path: Path,
) -> None:
    code, _, err = run("keys", "generate", "--out", str(tmp_path / "envbuild.pub"))
    assert code == 2
    assert "is the public key's name" in one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_keys_generate_asks_twice_at_a_terminal_and_never_echoes(tmp_path: Path) -> None:
    """A real pseudo-terminal, so click hides the input as it would for a person."""
    private = tmp_path / "tty.key"
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
    pid, fd = pty.fork()
    if pid == 0:  # the child: envbuild on the terminal
        os.chdir(ROOT)
        os.execve(
            sys.executable,
            [sys.executable, "-m", "envbuild", "keys", "generate", "--out", str(private)],
            env,
        )
    screen = b""
    for answer in (PASSWORD, PASSWORD):
        screen += read_until(fd, b": ")
        os.write(fd, answer.encode() + b"\r")
    screen += read_until(fd, None)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = screen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert text.count("Password for the new key") == 1
    assert "Repeat for confirmation" in text
    assert f"private key: {private}" in text
    assert_no_secret(private, text)
    serialization.load_pem_private_key(private.read_bytes(), PASSWORD.encode())


def read_until(fd: int, marker: bytes | None, limit_s: float = 60.0) -> bytes:
    """What the terminal shows until `marker` (None: until the program closes it)."""
    seen = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the program has exited and closed the terminal
            return seen
        if not chunk:
            return seen
        seen += chunk
        if marker is not None and seen.rstrip().endswith(marker.rstrip()):
            return seen
    pytest.fail(f"the terminal showed {seen!r} and then nothing for {limit_s} s")


@pytest.mark.parametrize("kind", ["--kyverno", "--policy-controller"])
def test_policy_prints_yaml_with_the_public_key(kind: str, key_pair: tuple[Path, Path]) -> None:
    private, public = key_pair
    code, out, err = run("policy", "--key", str(public), "--image", "registry.corp/ml/*", kind)
    assert code == 0, err
    documents = [d for d in yaml.safe_load_all(out) if d]
    expected = {"--kyverno": ["ClusterPolicy"], "--policy-controller": ["ClusterImagePolicy"] * 2}
    assert [d["kind"] for d in documents] == expected[kind]
    assert set(pem_values(documents)) == {public.read_text()}
    assert_no_secret(private, out, err)


def pem_values(node: object) -> list[str]:
    """Every string in the documents that holds a PEM."""
    if isinstance(node, dict):
        return [pem for value in node.values() for pem in pem_values(value)]
    if isinstance(node, list):
        return [pem for item in node for pem in pem_values(item)]
    return [node] if isinstance(node, str) and "-----BEGIN" in node else []


def test_policy_writes_the_file_named_by_o(key_pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, public = key_pair
    args = ("policy", "--key", str(public), "--image", "r.io/x", "--kyverno", "--name", "ml")
    _, printed, _ = run(*args)
    target = tmp_path / "policy.yaml"
    target.write_text("old\n")
    code, out, err = run(*args, "-o", str(target))
    assert code == 0, err
    assert out == ""
    assert target.read_text() == printed
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("where", ["folder", "file-as-folder/policy.yaml", "/proc/policy.yaml"])
def test_policy_checks_o_before_anything_else(tmp_path: Path, where: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file-as-folder").write_text("")
    target = tmp_path / where
    # The key and the kind are wrong too: -o is checked first, before a key is read.
    code, _, err = run("policy", "--key", str(tmp_path / "absent.pub"), "-o", str(target))
    assert code == 2
    assert one_error_line(err).startswith("envbuild: error: -o ")
    assert (tmp_path / "file-as-folder").read_text() == ""


def test_policy_makes_the_folder_o_names(key_pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, public = key_pair
    target = tmp_path / "new" / "policies" / "vetted.yaml"
    code, _, err = run(
        "policy", "--key", str(public), "--image", "r.io/x", "--kyverno", "-o", str(target)
    )
    assert code == 0, err
    assert yaml.safe_load(target.read_text())["kind"] == "ClusterPolicy"


def test_policy_with_the_private_key_is_one_line(key_pair: tuple[Path, Path]) -> None:
    private, _ = key_pair
    code, out, err = run("policy", "--key", str(private), "--image", "r.io/x", "--kyverno")
    assert code == 2
    assert "is a private key; pass its public key" in one_error_line(err)
    assert out == ""
    assert_no_secret(private, out, err)


def other_public_keys() -> dict[str, bytes]:
    keys = {
        "p384": ec.generate_private_key(ec.SECP384R1()).public_key(),
        "secp256k1": ec.generate_private_key(ec.SECP256K1()).public_key(),
        "ed25519": ed25519.Ed25519PrivateKey.generate().public_key(),
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(),
    }
    encoded = {
        name: key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for name, key in keys.items()
    }
    encoded["garbage"] = b"-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n"
    encoded["empty"] = b""
    return encoded


@pytest.mark.parametrize("name", sorted(other_public_keys()))
@pytest.mark.parametrize("kind", ["--kyverno", "--policy-controller"])
def test_policy_with_a_key_that_is_not_p256_is_one_line(
    tmp_path: Path, name: str, kind: str
) -> None:
    path = tmp_path / f"{name}.pub"
    path.write_bytes(other_public_keys()[name])
    code, out, err = run("policy", "--key", str(path), "--image", "r.io/x", kind)
    assert code == 2
    assert "--key" in one_error_line(err)
    assert out == ""


@pytest.mark.parametrize("kinds", [(), ("--kyverno", "--policy-controller")], ids=["none", "both"])
def test_policy_needs_exactly_one_kind(key_pair: tuple[Path, Path], kinds: tuple[str, ...]) -> None:
    _, public = key_pair
    code, _, err = run("policy", "--key", str(public), "--image", "r.io/x", *kinds)
    assert code == 2
    assert "--kyverno or --policy-controller" in one_error_line(err)


@pytest.mark.parametrize(
    "images", [(), ("--image", ""), ("--image", "r.io/x y")], ids=["none", "empty", "space"]
)
def test_policy_with_no_usable_pattern_is_one_line(
    key_pair: tuple[Path, Path], images: tuple[str, ...]
) -> None:
    _, public = key_pair
    code, out, err = run("policy", "--key", str(public), "--kyverno", *images)
    assert code == 2
    assert "--image" in one_error_line(err)
    assert out == ""


def test_help_of_the_signing_commands_loads_no_cryptography_nor_yaml() -> None:
    code = (
        "import sys\n"
        "from envbuild.cli.main import main\n"
        "for args in (['--help'], ['keys', 'generate', '--help'], ['policy', '--help']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "heavy = [m for m in ('cryptography', 'yaml', 'docker', 'jinja2') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "keys" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "HEAVY="


def signing_mistakes(
    tmp_path: Path, key_pair: tuple[Path, Path]
) -> dict[str, tuple[list[str], dict[str, str | None], str]]:
    """--sign and --key given wrongly: arguments, environment, and the words of the one line.
    Each is refused before any engine, index or registry is asked (none is reachable here)."""
    private, public = key_pair
    unreachable = "127.0.0.1:9/ml"
    key_env = {"ENVBUILD_SIGNING_KEY": str(private), PASSWORD_ENV: PASSWORD}
    return {
        "build --sign without --push": (
            ["build", "--framework", "torch", "--cuda", "cpu", "--sign"], key_env, "add --push",
        ),
        "build --sign without a key": (
            ["build", "--framework", "torch", "--cuda", "cpu", "--push", unreachable, "--sign"],
            {"ENVBUILD_SIGNING_KEY": None}, "set ENVBUILD_SIGNING_KEY",
        ),
        "publish --sign with a wrong password": (
            ["publish", "--framework", "torch", "--registry", unreachable, "--sign"],
            {"ENVBUILD_SIGNING_KEY": str(private), PASSWORD_ENV: "not the password 93b1"},
            "wrong password",
        ),
        "publish --sign with the public key": (
            ["publish", "--framework", "torch", "--registry", unreachable, "--sign"],
            {"ENVBUILD_SIGNING_KEY": str(public)}, "is a public key",
        ),
        "verify --key with the private key": (
            ["verify", f"{unreachable}/torch:1", "--key", str(private)], {}, "is a private key",
        ),
        "verify --key missing": (
            ["verify", f"{unreachable}/torch:1", "--key", str(tmp_path / "absent.pub")], {},
            "no such file",
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "build --sign without --push",
        "build --sign without a key",
        "publish --sign with a wrong password",
        "publish --sign with the public key",
        "verify --key with the private key",
        "verify --key missing",
    ],
)
def test_signing_mistakes_are_one_line_before_any_work(
    case: str, tmp_path: Path, key_pair: tuple[Path, Path]
) -> None:
    args, env, words = signing_mistakes(tmp_path, key_pair)[case]
    # DOCKER_HOST at nothing: a command that reached for the engine would fail another way.
    env = {**env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert words in one_error_line(result.stderr)
    assert_no_secret(key_pair[0], result.stdout, result.stderr)
