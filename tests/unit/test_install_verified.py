"""The installer checks the wheelhouse's wheels against the lock's hashes itself and gives uv
only those, offline and without hashes (uv unpacks a wheel whose hash it must check on one core):
a wheel no hash of the lock names, one for another machine or Python, a pin with a marker, a
link, a folder or a FIFO named like a wheel is never given to uv that way, and a tampered wheel
still fails the install. Real uv, real (tiny) wheels; generated cases of each class."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.build.server import build_files, serve
from envbuild.core.models import ServedInputs
from envbuild.lock.uv import uv_binary
from envbuild.payload import install_env
from tests.unit.test_build_server import LOOPBACK, installed, make_wheel, run_installer

MACHINE = platform.machine()
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def lock_of(pins: dict[str, Path | str]) -> str:
    """A lock of `pins` (name==version -> its wheel, or a hex digest), as `envbuild lock` writes."""
    text = "# envbuild lock\n"
    for pin, wheel in pins.items():
        digest = wheel if isinstance(wheel, str) else hashlib.sha256(wheel.read_bytes()).hexdigest()
        text += f"{pin} \\\n    --hash=sha256:{'f' * 64} \\\n    --hash=sha256:{digest}\n"
    return text


@pytest.mark.parametrize(
    ("name", "fits"),
    [
        ("a-1.0-py3-none-any.whl", True),
        ("a-1.0-py2.py3-none-any.whl", True),
        (f"a-1.0-{PY}-{PY}-manylinux_2_17_{MACHINE}.manylinux2014_{MACHINE}.whl", True),
        (f"a-1.0-{PY}-{PY}-manylinux2014_{MACHINE}.whl", True),
        (f"a-1.0-{PY}-{PY}-manylinux1_{MACHINE}.whl", True),
        (f"a-1.0-{PY}-{PY}-linux_{MACHINE}.whl", True),
        (f"a-1.0-cp38-abi3-manylinux_2_17_{MACHINE}.whl", True),
        (f"a-1.0-1build-{PY}-{PY}-manylinux_2_17_{MACHINE}.whl", True),  # a build tag
        (f"a-1.0-{PY}-{PY}-manylinux_2_99_{MACHINE}.whl", False),  # a newer glibc than here
        (f"a-1.0-{PY}-{PY}-musllinux_1_2_{MACHINE}.whl", False),  # no glibc there
        ("a-1.0-cp39-cp39-manylinux_2_17_x86_64.whl", False),  # another Python
        ("a-1.0-cp399-abi3-manylinux_2_17_x86_64.whl", False),  # abi3 of a later Python
        (f"a-1.0-{PY}-{PY}t-manylinux_2_17_{MACHINE}.whl", False),  # free-threaded
        ("a-1.0-py3-none-manylinux_2_17_riscv64.whl", False),  # another machine
        ("a-1.0-py3-none-win_amd64.whl", False),
        ("a-1.0-py3-none-macosx_11_0_arm64.whl", False),
        ("a-1.0-py2-none-any.whl", False),
        ("a-1.0-py3-none.whl", False),  # too few tags
        ("a-1.0-py3-none-any.zip", False),
        ("", False),
    ],
)
def test_a_wheel_fits_this_machine_by_its_name(name: str, fits: bool) -> None:
    assert install_env.fits_here(name) is fits


# One pin's wheel in the wheelhouse: as the lock says (kept), tampered (its bytes are not the
# lock's), for another machine, missing, under a pin with an environment marker, or a link, a
# folder or a FIFO under the wheel's name.
KINDS = ("kept", "tampered", "other-machine", "missing", "marker", "link", "folder", "fifo")


def wheelhouse(tmp_path: Path, kinds: list[str]) -> tuple[Path, Path, set[str]]:
    """Pins p0, p1, ... of `kinds` (KINDS): the wheelhouse, the lock and the pins to be local."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    source.mkdir(parents=True)
    wheels.mkdir()
    lock_text = "# envbuild lock\n"
    local = set()
    for index, kind in enumerate(kinds):
        name = f"p{index}"
        real = make_wheel(source, name, "1.0")
        pin = f"{name}==1.0" + (" ; python_version >= '3'" if kind == "marker" else "")
        lock_text += lock_of({pin: real}).removeprefix("# envbuild lock\n")
        placed = wheels / real.name
        if kind in ("kept", "marker"):
            placed.write_bytes(real.read_bytes())
        elif kind == "tampered":
            placed.write_bytes(real.read_bytes() + b"\0")
        elif kind == "other-machine":
            (wheels / f"{name}-1.0-py3-none-win_amd64.whl").write_bytes(real.read_bytes())
        elif kind == "link":
            placed.symlink_to(real)  # the lock's bytes, behind a link: followed, and checked
        elif kind == "folder":
            placed.mkdir()
        elif kind == "fifo":
            os.mkfifo(placed)
        if kind in ("kept", "link"):
            local.add(name)
    lock = tmp_path / "envbuild.lock"
    lock.write_text(lock_text)
    return wheels, lock, local


def install_offline(
    wheels: Path, venv: Path, lock: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """The installer, run on this machine from a build server that offers `wheels`, with no
    index, with `options`: its result. (Never with --epoch here: that refuses, and once walked
    the whole machine's files.)"""
    served = ServedInputs(
        ca_bundle=None, wheels=tuple(sorted(wheels.iterdir())), index_url=None,
        extra_index_urls=(), offline=True,
    )  # fmt: skip
    with serve(LOOPBACK, build_files(served, Path(uv_binary()))) as base:
        return run_installer(base, *options, str(venv), str(lock))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
def test_only_wheels_with_the_locks_hash_for_this_machine_go_to_uv_unchecked(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[str]
) -> None:
    tmp_path = tmp_path_factory.mktemp("split")
    wheels, lock, local = wheelhouse(tmp_path, kinds)
    scratch, venv = tmp_path / "scratch", tmp_path / "venv"
    scratch.mkdir()
    found, rest = install_env.split_verified(str(lock), str(wheels), str(scratch), str(venv))
    requirements = install_env.lock_requirements(str(lock))
    if not local:
        assert (found, rest) == (None, str(lock))  # uv checks every hash, as before
        return
    assert found is not None
    verified, local_file = found
    assert Path(local_file).read_text().splitlines() == [f"{name}==1.0" for name in sorted(local)]
    linked = sorted(path.name for path in Path(verified).iterdir())
    assert linked == [f"{name}-1.0-py3-none-any.whl" for name in sorted(local)]
    for link in linked:  # each link leads to bytes whose hash the lock gives for the pin
        digest = hashlib.sha256(Path(verified, link).read_bytes()).hexdigest()
        assert f"--hash=sha256:{digest}" in lock.read_text()
    # Every other pin goes to uv with its hash lines, as the lock wrote them.
    others = [lines for name, _, lines in requirements if name not in local]
    if others:
        assert rest is not None
        assert Path(rest).read_text() == "".join(line for lines in others for line in lines)
    else:
        assert rest is None


def test_a_tampered_wheel_fails_the_install_with_real_uv(tmp_path: Path) -> None:
    """The wheelhouse holds a kept wheel and one whose bytes are not the lock's: the kept one is
    installed from the checked folder, the tampered one goes to uv with its hashes, and uv refuses
    it (offline: the index cannot stand in). Then the same without the tampered one: installed."""
    wheels, lock, local = wheelhouse(tmp_path, ["kept", "tampered"])
    assert local == {"p0"}
    venv = tmp_path / "venv"
    refused = install_offline(wheels, venv, lock)
    assert refused.returncode == 1
    assert "Hash mismatch for `p1==1.0`" in refused.stderr
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(f"envbuild install: uv could not install {lock} (exit ")
    )

    kept, lock2, _ = wheelhouse(tmp_path / "again", ["kept", "kept"])
    venv2 = tmp_path / "venv2"
    done = install_offline(kept, venv2, lock2)
    assert done.returncode == 0, done.stderr
    assert {"p0==1.0", "p1==1.0"} <= installed(venv2)
    (site,) = venv2.glob("lib/python3*/site-packages")
    # Installed by name from a folder, not as a direct URL: nothing of the scratch folder stays.
    assert not list(site.glob("p*-1.0.dist-info/direct_url.json"))
    assert list(site.glob("p0/__pycache__/*.pyc"))
    assert "hashes " in done.stderr.strip().splitlines()[-1]


def test_a_pin_the_venv_holds_is_not_read_again(tmp_path: Path) -> None:
    """The team's step above the framework's: the wheelhouse's wheel of a pin the venv holds is
    not hashed (BuildKit mounts the whole wheelhouse), and the pin stays uv's to audit."""
    wheels, lock, _ = wheelhouse(tmp_path, ["kept", "kept"])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "p0-1.0.dist-info").mkdir()
    (wheels / "p0-1.0-py3-none-any.whl").write_bytes(b"unreadable")
    (wheels / "p0-1.0-py3-none-any.whl").chmod(0)  # root reads it anyway: the hash says no
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    found, rest = install_env.split_verified(str(lock), str(wheels), str(scratch), str(venv))
    assert found is not None
    assert Path(found[1]).read_text() == "p1==1.0\n"
    assert rest is not None
    assert Path(rest).read_text().startswith("p0==1.0 \\\n")


def test_a_wheel_with_the_locks_hash_that_uv_cannot_install_is_one_line(tmp_path: Path) -> None:
    """The lock names the bytes (so the installer links it) but they are no wheel: uv's first
    run fails, and the install ends with one line naming the lock."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    broken = wheels / "p0-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip archive")
    lock = tmp_path / "envbuild.lock"
    lock.write_text(lock_of({"p0==1.0": broken}))
    served = ServedInputs(
        ca_bundle=None, wheels=(broken,), index_url=None, extra_index_urls=(), offline=True
    )
    with serve(LOOPBACK, build_files(served, Path(uv_binary()))) as base:
        result = run_installer(base, str(tmp_path / "venv"), str(lock))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"envbuild install: uv could not install the wheelhouse's wheels of {lock} (exit 1); "
        "see its output above"
    )


def test_both_runs_of_uv_get_their_bytecode(tmp_path: Path) -> None:
    """A kept wheel goes to uv's first run and a pin under a marker to its second, which checks
    its hash: each run's files are compiled (the first run's while the second runs), and the
    venv's seeds with them. The seeds go in the first run, so that their bytecode is made while
    the second one downloads."""
    wheels, lock, local = wheelhouse(tmp_path, ["kept", "marker"])
    assert local == {"p0"}
    venv = tmp_path / "venv"
    done = install_offline(wheels, venv, lock)
    assert done.returncode == 0, done.stderr
    said = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("+ ")]
    (seed,) = (i for i, line in enumerate(said) if line.startswith("+ pip=="))
    assert said.index("+ p0==1.0") < seed < said.index("+ p1==1.0")
    assert {"p0==1.0", "p1==1.0"} <= installed(venv)
    (site,) = venv.glob("lib/python3*/site-packages")
    for name in ("p0", "p1"):
        assert len(list(site.glob(f"{name}/__pycache__/*.pyc"))) == 1
    sources = [p for p in site.rglob("*.py") if not {"tests", "test"} & set(p.parts)]
    pycs = list(site.rglob("*.pyc"))
    assert len(pycs) > 2  # the seeds' too
    said = re.search(r"envbuild install: (\d+) files byte-compiled", done.stderr)
    assert said is not None
    assert int(said[1]) == len(pycs) <= len(sources)


@pytest.mark.parametrize("where", ["first", "last", "twice"])
def test_no_bytecode_installs_both_runs_and_compiles_nothing(tmp_path: Path, where: str) -> None:
    """--no-bytecode (the matrix's `bytecode: false`), alone or after --only: both of uv's runs
    install (and the venv's seeds, without --only) and no .pyc is made; given twice, it is the
    usage line, exit 2, and nothing installed."""
    wheels, lock, _ = wheelhouse(tmp_path, ["kept", "marker"])
    venv = tmp_path / "venv"
    options = {
        "first": ("--no-bytecode",),
        "last": ("--only", "p*", "--no-bytecode"),
        "twice": ("--no-bytecode", "--no-bytecode"),
    }[where]
    done = install_offline(wheels, venv, lock, *options)
    if where == "twice":
        assert done.returncode == 2
        assert done.stderr.startswith("usage: ")
        assert not venv.exists()
        return
    assert done.returncode == 0, done.stderr
    assert {"p0==1.0", "p1==1.0"} <= installed(venv)
    assert any(name.startswith("pip==") for name in installed(venv)) is (where == "first")
    assert not list(venv.rglob("*.pyc"))
    assert "envbuild install: 0 files byte-compiled (--no-bytecode)" in done.stderr
