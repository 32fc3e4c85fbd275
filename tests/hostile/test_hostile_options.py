"""Hostile option values through the real command line: one error line, exit 2, no traceback,
no secret shown, nothing written outside -o, and no line injected into a Dockerfile.

The corpus is generated below; every value runs through `envbuild` in-process (CliRunner), and a
representative subset through `python -m envbuild` in a memory-limited subprocess.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from envbuild.build.render import CA_MAX_BYTES
from envbuild.cli.main import main
from envbuild.core.models import BuildOptions, Knowledge, Selection
from envbuild.core.names import (
    image_reference_problem,
    index_url_problem,
    redact_url,
    repository_problem,
)
from envbuild.knowledge.load import load_knowledge
from envbuild.plan.compat import compute_capability, cuda_selector
from tests.support.lock_support import fresh_lock, the_entry

SECRET = "S3CRET-pa55word"
PAYLOAD = "RUN touch /pwned"
HEX64 = "0123456789abcdef" * 4
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
ONE_ENTRY = ("--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
             "--python", "3.11", "--os", "bookworm")  # fmt: skip
ENTRY_ID = "torch2.13.0-cpu-py3.11-bookworm"
# Line breaks as str.splitlines, a Dockerfile parser or a terminal would see them.
BREAKS = ("\n", "\r", "\r\n", "\x00", "\x0b", "\x1c", "\x85", "\u2028")
OTHER_DIGITS = (
    "\u00b9\u00b2",
    "\u0661\u0662",
    "\uff11\uff12",
    "\u0967\u0968",
)  # superscript, Arabic-Indic, fullwidth, Devanagari


def injected(prefix: str) -> Iterator[str]:
    """`prefix` followed by each line break and a Dockerfile instruction."""
    for brk in BREAKS:
        yield f"{prefix}{brk}{PAYLOAD}"


def repository_values() -> Iterator[str]:
    for width in (10, 10_000_000_000):
        yield f"{{framework:>{width}}}"
    yield from ("{foo}", "{0}", "{}", "a{", "}", "{{framework}}", "{framework.__class__}",
                "{framework!r}", "{framework[0]}", "team/{FRAMEWORK}")  # fmt: skip
    yield from ("", "Team/{framework}", "a//b", "-lead/{framework}", "a/b/", "host:99999/x",
                "host:/x", "a b/{framework}", "envbuild/{framework}:latest",
                f"envbuild/{{framework}}@sha256:{HEX64}", "x" * 300 + "/{framework}")  # fmt: skip
    yield from injected("envbuild/{framework}")


def cuda_values() -> Iterator[str]:
    yield from ("", "cu", "CU", "c", "cuda", "cu1210", "12.10", "12.1.1", "012", "0", "cu012",
                "12 ", " 12", "-1", "1e3", "cu12.1", "12.", ".1", "9" * 5000, "cpu,12")  # fmt: skip
    yield from OTHER_DIGITS
    yield from (f"cu{digits}" for digits in OTHER_DIGITS)
    yield from injected("12.1")


def gpu_values() -> Iterator[str]:
    yield from ("sm_00", "sm_999999", "sm_", "sm", "0.0", "21.0", "9.10", "sm_9", "9",
                "sm_1000", "sm_-90", "", "x" * 100_000)  # fmt: skip
    yield from (f"sm_{digits}" for digits in OTHER_DIGITS)
    yield from (f"{digits}.0" for digits in OTHER_DIGITS)
    yield from injected("H100")


def driver_values() -> Iterator[str]:
    yield from ("9" * 5000, "535.104.05.1", "", "535.", ".535", "1234567", "-535",
                "535.104.05 ", "latest", "1" * 7 + ".0")  # fmt: skip
    yield from OTHER_DIGITS
    yield from injected("535.104.05")


def selector_values() -> Iterator[tuple[str, str]]:
    for option, good in (("--python", "3.11"), ("--os", "bookworm"), ("--framework", "torch"),
                         ("--framework-version", "2.13.0")):  # fmt: skip
        yield option, ""
        yield option, good + " "
        for value in injected(good):
            yield option, value


def base_image_values() -> Iterator[str]:
    yield from ("", " ", "UPPER/case", "a b", "python:3.11 AS evil", "x:", ":tag",
                "x@sha256:short", f"x@sha256:{HEX64.upper()}", "x" * 300, "--build-arg",
                "$(id)", "${X}", "a:b:c", f"@sha256:{HEX64}", 'debian" \\', "x:" + "t" * 129,
                "host:99999/x", "a..b/c", "[::1/x", "debian:bookworm\\")  # fmt: skip
    yield from injected("debian:bookworm")
    yield from injected(f"debian@sha256:{HEX64}")


def url_values() -> Iterator[str]:
    base = f"https://user:{SECRET}@mirror.example"
    for brk in (*BREAKS, " ", "\t"):
        yield f"{base}/simple{brk}{PAYLOAD}"
    yield from (f"ftp://user:{SECRET}@mirror.example/", "file:///etc/passwd", f"user:{SECRET}@host",
                f"https://user:{SECRET}@[::1/simple", f"https://user:{SECRET}@host:99999/",
                "http://", "", "javascript:alert(1)", f"https://user:{SECRET}@h\u00f3st/",
                f"https://{SECRET}@host/ x", f"https://user:{SECRET}/x@host/ simple",
                f"htps//user:{SECRET}@host/\n")  # fmt: skip


def proxy_values() -> Iterator[str]:
    base = f"http://user:{SECRET}@proxy.example:3128"
    for brk in (*BREAKS, " ", "\t"):
        yield f"{base}{brk}{PAYLOAD}"
    yield from ("", "proxy.example:3128", f"user:{SECRET}@proxy.example:3128", "http://",
                f"ftp://user:{SECRET}@proxy.example/", f"socks5://user:{SECRET}@proxy.example",
                f"http://user:{SECRET}@", f"http://user:{SECRET}@pr\u00f6xy.example:3128",
                f"{base}/path", f"http://user:{SECRET}@proxy.example:99999",
                f"http://user:{SECRET}/x@proxy.example", f"{base}0" + "0" * 10_240)  # fmt: skip


def ca_bundle_values() -> Iterator[str]:
    missing = "/nonexistent-envbuild/ca.pem"
    yield from ("", "/", "/dev/null", "/proc", missing, "x" * 5000)
    # No NUL: no command line can carry one (execve), and click.Path stats the value first.
    yield from (value for value in injected(missing) if "\x00" not in value)


REGISTRY_COMMANDS = {  # arguments that reach a registry, were --ca-bundle accepted
    "verify": ("127.0.0.1:9/team/torch:1",),
    "publish": ("--registry", "127.0.0.1:9/team", "envbuild/torch:x"),
}


def corpus() -> Iterator[tuple[str, tuple[str, ...], str]]:
    """(command, arguments, the option the error must name) for every hostile value."""
    for value in repository_values():
        yield "plan", (f"--repository={value}",), "--repository"
    for value in cuda_values():
        yield "plan", (f"--cuda={value}",), "--cuda"
    for value in gpu_values():
        yield "plan", (f"--gpu={value}",), "--gpu"
    for value in driver_values():
        yield "plan", (f"--driver={value}",), "--driver"
    for option, value in selector_values():
        yield "plan", (f"{option}={value}",), option
    for value in base_image_values():
        yield "render", (f"--base-image={value}",), "--base-image"
    options = ("--index-url", "--extra-index-url", "--framework-index")
    for option, value in itertools.product(options, url_values()):
        yield "render", (f"{option}={value}",), option
    for value in proxy_values():  # refused before the engine or the network is asked
        yield "build", (f"--proxy={value}", "--no-smoke", *ONE_ENTRY), "--proxy"
    for (command, args), value in itertools.product(REGISTRY_COMMANDS.items(), ca_bundle_values()):
        yield command, (f"--ca-bundle={value}", *args), "--ca-bundle"  # before the engine


CORPUS = list(corpus())


def test_the_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 80
    assert {option for _, _, option in CORPUS} >= {
        "--repository", "--cuda", "--gpu", "--driver", "--base-image", "--index-url",
        "--extra-index-url", "--proxy", "--framework-index", "--ca-bundle",
    }  # fmt: skip


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_one_error_line(result: Result, option: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"envbuild: error: {option} ")
    assert "Traceback" not in result.output


def assert_no_secret(result: Result) -> None:
    assert SECRET not in result.output
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(("command", "args", "option"), CORPUS)
def test_hostile_value_is_one_error_line(
    tmp_path: Path, command: str, args: tuple[str, ...], option: str
) -> None:
    out = tmp_path / "out"
    extra = ("-o", str(out), *ONE_ENTRY) if command == "render" else ()
    result = invoke(command, *args, *extra)
    assert_one_error_line(result, option)
    assert_no_secret(result)
    assert not out.exists() or not any(out.rglob("*"))  # refused before anything was written


def render_one(
    tmp_path: Path, *args: str, options: BuildOptions | None = None, out: Path | None = None
) -> tuple[Result, Path]:
    """`render` of ONE_ENTRY, its lock already written (fresh for `options`, which must match
    the lock-relevant options in `args`): rendering itself needs no network."""
    knowledge = load_knowledge()
    entry = the_entry(
        knowledge, Selection(framework="torch", framework_version="2.13.0", cuda="cpu")
    )
    assert entry.id == ENTRY_ID
    fresh_lock(entry, options or BuildOptions(), knowledge)
    out = out or tmp_path / "out"
    return invoke("render", "-o", str(out), *ONE_ENTRY, *args), out / ENTRY_ID


def test_cuda_cu121_picks_the_12_1_entries() -> None:
    tagged = invoke("plan", "--cuda", "cu121", "--framework", "torch", "--format", "json")
    dotted = invoke("plan", "--cuda", "12.1", "--framework", "torch", "--format", "json")
    assert tagged.exit_code == 0, tagged.output
    entries = json.loads(tagged.stdout)["entries"]
    assert entries
    assert {e["cuda"] for e in entries} == {"12.1"}
    assert entries == json.loads(dotted.stdout)["entries"]


@pytest.mark.parametrize(
    ("text", "selected"),
    [("cpu", "cpu"), ("CPU", "cpu"), ("12", "12"), ("12.1", "12.1"), ("cu121", "12.1"),
     ("CU121", "12.1"), ("cu118", "11.8"), ("cu130", "13.0"), ("cu12", "12"), ("Cu13", "13")],
)  # fmt: skip
def test_cuda_selectors_read_as_cuda_tag_writes_them(text: str, selected: str) -> None:
    assert cuda_selector(text) == selected


def test_cuda_values_of_the_corpus_select_nothing() -> None:
    assert [v for v in cuda_values() if cuda_selector(v) is not None] == []


def test_compute_capabilities_only_in_range() -> None:
    assert compute_capability("sm_90") == "9.0"
    assert compute_capability("SM120") == "12.0"
    assert compute_capability("8.6") == "8.6"
    assert [v for v in gpu_values() if compute_capability(v) is not None] == []


@pytest.mark.parametrize("args", [("--gpu", "sm_90"), ("--gpu", "9.0"), ("--gpu", "H100"),
                                  ("--driver", "535.104.05"), ("--driver", "580")])  # fmt: skip
def test_valid_fleet_values_still_plan(args: tuple[str, str]) -> None:
    result = invoke("plan", "--framework", "torch", *args)
    assert result.exit_code == 0, result.output


def test_repository_takes_only_the_framework_placeholder(knowledge: Knowledge) -> None:
    frameworks = list(knowledge.frameworks)
    assert repository_problem("envbuild/{framework}", frameworks) is None
    assert repository_problem("registry.example.com:5000/team/{framework}", frameworks) is None
    assert all(repository_problem(v, frameworks) is not None for v in repository_values())
    result = invoke("plan", "--framework", "torch", "--cuda", "cpu", "--format", "json",
                    "--repository", "127.0.0.1:5000/team/{framework}-images")  # fmt: skip
    assert result.exit_code == 0, result.output
    images = {e["image"].rsplit(":", 1)[0] for e in json.loads(result.stdout)["entries"]}
    assert images == {"127.0.0.1:5000/team/torch-images"}


@pytest.mark.parametrize(
    "reference",
    ["python:3.11-slim-bookworm", "registry.example.com:5000/team/base:1", "localhost/x",
     "[::1]:5000/a/b:c", f"x@sha256:{HEX64}", f"sha256:{HEX64}", "envbuild/base:bookworm"],
)  # fmt: skip
def test_valid_base_images_render_as_given(tmp_path: Path, reference: str) -> None:
    assert image_reference_problem(reference) is None
    result, context = render_one(tmp_path, "--base-image", reference)
    assert result.exit_code == 0, result.output
    assert f"FROM {reference} AS runtime\n" in (context / "Dockerfile").read_text()


def test_no_hostile_base_image_is_a_reference() -> None:
    assert [v for v in base_image_values() if image_reference_problem(v) is None] == []


@pytest.mark.parametrize("url", list(url_values()))
def test_urls_are_refused_with_their_password_masked(url: str) -> None:
    assert index_url_problem(url) is not None
    assert SECRET not in redact_url(url)


def test_valid_index_urls_render_and_stay_out_of_the_context(tmp_path: Path) -> None:
    index, extra = f"https://user:{SECRET}@mirror.example/simple", "http://127.0.0.1:8080/simple/"
    result, context = render_one(
        tmp_path, "--index-url", index, "--extra-index-url", extra,
        options=BuildOptions(index_url=index, extra_index_urls=(extra,)),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert_no_secret(result)
    assert not any(SECRET in p.read_text() for p in context.rglob("*") if p.is_file())


def make_ca(tmp_path: Path, kind: str) -> Path:
    """A --ca-bundle value of a hostile kind."""
    path = tmp_path / f"ca-{kind}"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "not-pem":
        path.write_text("not a certificate\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":
        with path.open("wb") as handle:
            handle.write(PEM)
            handle.truncate(CA_MAX_BYTES + 1)
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "link-loop":
        path.symlink_to(path)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo-target")
        path.symlink_to(tmp_path / "fifo-target")
    elif kind == "newline-name":
        path = tmp_path / f"ca\n{PAYLOAD}"
    elif kind == "device":
        path = Path("/dev/null")
    return path


CA_KINDS = ["directory", "fifo", "not-pem", "empty", "huge", "missing", "dangling-link",
            "link-loop", "link-to-fifo", "newline-name", "device"]  # fmt: skip


@pytest.mark.parametrize("kind", CA_KINDS)
def test_hostile_ca_bundles_are_one_error_line(tmp_path: Path, kind: str) -> None:
    result, context = render_one(tmp_path, "--ca-bundle", str(make_ca(tmp_path, kind)))
    assert_one_error_line(result, "--ca-bundle")
    assert not context.exists()


@pytest.mark.parametrize("command", list(REGISTRY_COMMANDS))
@pytest.mark.parametrize("kind", CA_KINDS)
def test_hostile_ca_bundles_stop_registry_commands_in_one_line(
    tmp_path: Path, kind: str, command: str
) -> None:
    ca = make_ca(tmp_path, kind)
    result = invoke(command, "--ca-bundle", str(ca), *REGISTRY_COMMANDS[command])
    assert_one_error_line(result, "--ca-bundle")


@pytest.mark.parametrize("kind", ["file", "missing", "fifo", "dangling-link"])
def test_a_wheelhouse_that_is_no_folder_is_one_error_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "wheels"
    if kind == "file":
        path.write_text("x")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
    result, _ = render_one(tmp_path, "--wheelhouse", str(path))
    assert_one_error_line(result, "--wheelhouse")


@pytest.mark.parametrize(
    "kind", ["a-file", "under-a-file", "entry-is-a-file", "dockerfile-is-a-folder"]
)
def test_an_output_that_cannot_be_written_is_one_error_line(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    if kind == "a-file":
        out.write_text("x")
    elif kind == "under-a-file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "out"
    elif kind == "entry-is-a-file":
        out.mkdir()
        (out / ENTRY_ID).write_text("x")
    else:
        (out / ENTRY_ID / "Dockerfile").mkdir(parents=True)
    result, _ = render_one(tmp_path, out=out)
    assert_one_error_line(result, "-o")


def test_a_read_only_output_is_one_error_line(tmp_path: Path) -> None:
    # Permission bits do not stop root (CI runs as root); procfs refuses new folders to anyone.
    out = tmp_path / "out"
    if os.geteuid() == 0:
        out = Path("/proc/envbuild-out")
    else:
        out.mkdir(mode=0o500)
    result, _ = render_one(tmp_path, out=out)
    assert_one_error_line(result, "-o")


def plant(kind: str, context: Path, outside: Path, sentinel: Path) -> None:
    """Prepare `context` (the entry's folder under -o) with a trap pointing outside."""
    if kind == "entry-folder-link":
        context.symlink_to(outside, target_is_directory=True)
        return
    context.mkdir(parents=True)
    name = {"dockerfile": "Dockerfile", "lock": "envbuild.lock", "installer": "install_env.py"}
    what, _, how = kind.partition("-")
    if how == "link":
        (context / name[what]).symlink_to(sentinel)
    elif how == "hard-link":
        (context / name[what]).hardlink_to(sentinel)
    elif kind == "relative-dotdot-link":
        (context / "Dockerfile").symlink_to(os.path.relpath(sentinel, context))


PLANTS = ["entry-folder-link", "dockerfile-link", "dockerfile-hard-link", "lock-link",
          "lock-hard-link", "installer-link", "installer-hard-link",
          "relative-dotdot-link"]  # fmt: skip
CONTEXT_FILES = ["Dockerfile", "envbuild.lock", "install_env.py"]


def secretless_options(tmp_path: Path) -> tuple[tuple[str, ...], BuildOptions]:
    """A CA bundle reached through a relative link (like Debian's /usr/lib/ssl/cert.pem) and a
    wheelhouse holding a linked wheel: as arguments, and as the lock sees them."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "bundle.pem").write_bytes(PEM)
    (store / "blob").write_bytes(b"wheel bytes")
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "cert.pem").symlink_to(Path("..") / "store" / "bundle.pem")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "extra-1.0-py3-none-any.whl").symlink_to(store / "blob")
    (wheels / "plain-1.0-py3-none-any.whl").write_bytes(b"more wheel bytes")
    args = ("--ca-bundle", str(etc / "cert.pem"), "--wheelhouse", str(wheels))
    return args, BuildOptions(wheelhouse=wheels)


@pytest.mark.parametrize("kind", PLANTS)
def test_planted_links_under_output_are_never_followed(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "sentinel"
    sentinel.write_text("untouched\n")
    out = tmp_path / "out"
    out.mkdir()
    plant(kind, out / ENTRY_ID, outside, sentinel)
    args, options = secretless_options(tmp_path)

    result, context = render_one(tmp_path, *args, options=options)

    assert result.exit_code == 0, result.output
    assert sentinel.read_text() == "untouched\n"
    assert sorted(p.name for p in outside.iterdir()) == ["sentinel"]
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    for name in CONTEXT_FILES:
        written = context / name
        assert written.is_file()
        assert written.stat().st_nlink == 1


def test_the_context_never_holds_the_ca_bundle_or_a_wheel(tmp_path: Path) -> None:
    """They are served to the build (envbuild/build/server.py), never put in its context."""
    args, options = secretless_options(tmp_path)
    result, context = render_one(tmp_path, *args, options=options)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in context.rglob("*")) == sorted(CONTEXT_FILES)
    for written in context.iterdir():
        data = written.read_bytes()
        assert PEM not in data
        assert b"wheel bytes" not in data


def test_the_review_copy_is_a_copy(tmp_path: Path) -> None:
    result, context = render_one(tmp_path)
    assert result.exit_code == 0, result.output
    (lock,) = Path(os.environ["XDG_CACHE_HOME"], "envbuild", "locks").glob(f"{ENTRY_ID}-*.txt")
    kept = lock.read_text()
    (context / "envbuild.lock").write_text("edited\n")
    assert lock.read_text() == kept
    assert (context / "envbuild.lock").read_text() == "edited\n"


def test_rendering_twice_into_the_same_folder_works(tmp_path: Path) -> None:
    first, context = render_one(tmp_path)
    second, _ = render_one(tmp_path)
    assert first.exit_code == second.exit_code == 0
    assert (context / "Dockerfile").read_text().startswith("# Generated by envbuild")


@pytest.mark.parametrize("value", ["debian:bookworm", "python:3.11-slim-bookworm"])
def test_no_rendered_dockerfile_holds_an_injected_line(tmp_path: Path, value: str) -> None:
    for hostile in injected(value):
        result, _ = render_one(tmp_path, "--base-image", hostile)
        assert result.exit_code == 2
    result, context = render_one(tmp_path, "--base-image", value)
    assert result.exit_code == 0
    for path in (tmp_path / "out").rglob("Dockerfile"):
        assert not any(line.strip() == PAYLOAD for line in path.read_text().splitlines())
    assert (context / "Dockerfile").read_text().count("\nFROM ") == 2  # runtime, then the image


def limit_memory() -> None:
    # A str.format width bomb once took 23 GB; here it would die of MemoryError instead.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


SUBPROCESS_CASES = [
    (("plan", "--repository={framework:>10000000000}"), "--repository"),
    (("plan", "--repository={framework.__class__}"), "--repository"),
    (("plan", f"--driver={'9' * 5000}"), "--driver"),
    (("plan", "--gpu=sm_\u00b9\u00b2"), "--gpu"),
    (("plan", "--cuda=cu"), "--cuda"),
    (("render", "-o", "{out}", *ONE_ENTRY, f"--base-image=debian:bookworm\n{PAYLOAD}"), "--base-image"),
    (("render", "-o", "{out}", *ONE_ENTRY, f"--index-url=https://u:{SECRET}@h/ x"), "--index-url"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "option"), SUBPROCESS_CASES)
def test_as_a_process(tmp_path: Path, args: tuple[str, ...], option: str) -> None:
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "envbuild", *argv],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a timing assertion
        preexec_fn=limit_memory,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"envbuild: error: {option} ")
    assert SECRET not in result.stdout + result.stderr
    assert not (tmp_path / "out").exists()
