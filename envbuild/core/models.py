"""Frozen dataclasses passed between the stages; of envbuild, this module imports only the label keys."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.core.labels import CONTENT_HASH
from envbuild.core.platforms import AMD64

CPU = "cpu"
# Which GPUs a container gets: every one, none, or every one where the engine has NVIDIA's runtime.
GPU_CHOICES = ("auto", "all", "none")
HASH_LABEL = CONTENT_HASH  # inherited by images built FROM an envbuild image
# Who an image runs as: envbuild's own user, not root, so that a cluster enforcing Kubernetes'
# restricted Pod Security standard (runAsNonRoot) admits it; `root` where a team needs it.
IMAGE_USER = "envbuild"
ROOT_USER = "root"
USER_CHOICES = (IMAGE_USER, ROOT_USER)
# The builders an image is built with (`--builder`): Docker's BuildKit, through the docker client
# (secrets as secret mounts, uv's cache kept), or the classic builder, through the engine's API
# (its inputs served from this host for the build's duration); AUTO: BuildKit where it works.
BUILDKIT = "buildkit"
CLASSIC = "classic"
AUTO = "auto"
BUILDER_CHOICES = (AUTO, BUILDKIT, CLASSIC)
# A fixed uid and gid, named in the Dockerfile's USER so that runAsNonRoot can verify it
# without reading the image's /etc/passwd.
IMAGE_UID = 1000
IMAGE_HOME = "/home/envbuild"


def user_spec(user: str) -> str:
    """The numeric USER, uid:gid, of an image that runs as `user` (one of USER_CHOICES)."""
    uid = 0 if user == ROOT_USER else IMAGE_UID
    return f"{uid}:{uid}"


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One build of a framework release: CPU-only or for one CUDA minor version."""

    cuda: str  # "cpu", "12.1", or a bare major "12" when pip picks the newest 12.x wheels
    cudnn: str | None  # exact pins
    nccl: str | None
    source: str
    requirement: str | None = None  # pip requirement with {version}; None: the torch convention
    index: str | None = None  # key into the framework's indexes; None: PyPI
    cudnn_min: str | None = None  # floors, where the package pins a range
    nccl_min: str | None = None
    # Pythons this variant installs on, where fewer than the release's (its dependencies lack
    # wheels for the others); None: every Python of the release. The note says why.
    python: tuple[str, ...] | None = None
    python_note: str | None = None
    python_source: str | None = None


@dataclass(frozen=True, kw_only=True)
class Release:
    """A framework release and the variants it published."""

    framework: str
    version: str
    released: str | None
    requires_python: str | None
    python: tuple[str, ...]
    pypi_variant: str | None
    variants: tuple[Variant, ...]
    source: str
    # Source id vouching that `variants` is the complete published set; None: not verified,
    # so a missing variant is unknown rather than absent. Except these CUDA versions, whose
    # publication is not verified either way.
    variants_verified: str | None = None
    unverified_variants: tuple[str, ...] = ()

    def variant(self, cuda: str) -> Variant | None:
        """The variant built for `cuda`, if the release published one."""
        return next((v for v in self.variants if v.cuda == cuda), None)


@dataclass(frozen=True, kw_only=True)
class FrameworkKnowledge:
    """Everything known about one framework: its releases and wheel indexes."""

    name: str
    package: str
    releases: tuple[Release, ...]  # ascending by version
    indexes: dict[str, str]  # variant -> wheel index URL for variants not on PyPI
    sources: dict[str, str]

    def release(self, version: str) -> Release | None:
        """The release with exactly this version string."""
        return next((r for r in self.releases if r.version == version), None)


@dataclass(frozen=True, kw_only=True)
class OsBase:
    """An operating-system base and the Python its own packages provide."""

    name: str
    version: str
    codename: str
    python: str
    image: str
    python_image: str | None  # e.g. "python:{python}-slim-bookworm"
    source: str
    glibc: str | None = None  # "2.36": the manylinux tag a lock is resolved for


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """A GPU model and its compute capability."""

    name: str
    cc: str  # "9.0"
    source: str


@dataclass(frozen=True, kw_only=True)
class ArchBuild:
    """Which compute capabilities a set of framework builds ships kernels for."""

    framework: str
    versions: tuple[str, ...]  # minor series ("2.12") or "*"
    cuda: tuple[str, ...]  # "12.6", a major "12", or "*"
    sm: tuple[str, ...]  # SASS targets; empty when only min_cc is known
    ptx: bool  # PTX for the newest target too: runs JIT-compiled on newer GPUs
    min_cc: str | None
    source: str
    platform: str = AMD64  # the wheels' platform (aarch64 builds target other GPUs)


@dataclass(frozen=True, kw_only=True)
class PlatformBuild:
    """What a framework publishes for a platform other than linux/amd64 (platforms.yaml): for
    the releases `versions` selects, each build variant and where it comes from."""

    platform: str  # linux/arm64
    framework: str
    versions: str  # a PEP 440 specifier: ">=2.11", ">=2.0,<2.11"
    # variant ("cpu", "13.0", a major "12") -> "plain" (`<package>==<version>` from PyPI: what a
    # plain install gets on that platform) or "variant" (its requirement and index, as on amd64)
    variants: dict[str, str]
    note: str | None  # why a variant is missing (an exclusion says it)
    source: str


@dataclass(frozen=True, kw_only=True)
class Knowledge:
    """The compatibility knowledge base loaded from matrices/knowledge/."""

    frameworks: dict[str, FrameworkKnowledge]
    cuda_family_driver: dict[str, str]  # CUDA major -> minimum driver (minor-version compat)
    cuda_family_source: dict[str, str]  # CUDA major -> source id of that floor
    cuda_toolkit_driver: dict[str, str]  # CUDA major.minor -> driver of the toolkit release
    cudnn_cuda: dict[str, tuple[tuple[str, str], ...]]  # cuDNN major.minor -> CUDA ranges
    os_bases: dict[str, OsBase]
    gpus: dict[str, Gpu]
    cuda_targets: dict[str, tuple[str, str | None, str]]  # CC -> (first CUDA, last CUDA, source id)
    arch_builds: tuple[ArchBuild, ...]
    sources: dict[str, str] = field(default_factory=dict)
    platform_builds: tuple[PlatformBuild, ...] = ()  # source id "file:key" -> source text


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One fact a decision rests on, whether it held, and where it comes from."""

    holds: bool
    text: str
    source: str  # the source's text (a URL or a description)

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping for `plan --explain --format json`."""
        return {"holds": self.holds, "fact": self.text, "source": self.source}


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """The hosts a plan is for: an NVIDIA driver version and GPU models, each optional."""

    driver: str | None = None
    gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Combination:
    """One point of a matrix before the compatibility rules have judged it."""

    framework: str
    framework_version: str
    cuda: str
    python: str
    os: str
    platform: str = AMD64  # linux/amd64 or linux/arm64 (core.platforms)

    def as_dict(self) -> dict[str, str]:
        """The fields as a plain mapping."""
        return {
            "framework": self.framework,
            "framework_version": self.framework_version,
            "cuda": self.cuda,
            "python": self.python,
            "os": self.os,
            "platform": self.platform,
        }


@dataclass(frozen=True, kw_only=True)
class Selection:
    """Selectors shared by every command that picks entries; None selects everything."""

    framework: str | None = None
    framework_version: str | None = None  # a prefix: "2.1" matches 2.1.x
    cuda: str | None = None  # "cpu", a major "12", or "12.1"
    python: str | None = None
    os: str | None = None
    platform: str | None = None  # linux/amd64 or linux/arm64, as core.platforms names them


@dataclass(frozen=True, kw_only=True)
class Install:
    """How the framework gets into the image."""

    requirement: str  # e.g. "torch==2.13.0+cpu"
    index_url: str | None  # the framework's own index, or None when PyPI serves the variant


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One image to build: a combination the rules accepted, with everything resolved."""

    id: str
    framework: str
    framework_version: str
    cuda: str
    cudnn: str | None
    nccl: str | None
    python: str
    os: str
    base_image: str
    image: str
    install: Install
    facts: tuple[Fact, ...] = ()  # why it is buildable (plan --explain)
    # The team's packages beside the framework: PEP 508, normalized, sorted, deduplicated.
    # They go into the lock, never into the id or the tag.
    packages: tuple[str, ...] = ()
    user: str = IMAGE_USER  # one of USER_CHOICES: who the image runs as
    platform: str = AMD64  # what the image is built for (core.platforms)
    # Whether the install byte-compiles what it installs (the matrix's defaults.bytecode): the
    # venv is read-only to a non-root user, so without it every process compiles on import.
    bytecode: bool = True

    @property
    def user_spec(self) -> str:
        """The image's numeric USER, uid:gid: what runAsNonRoot checks and the user label holds."""
        return user_spec(self.user)

    def combination(self) -> Combination:
        """The matrix point this entry was resolved from."""
        return Combination(
            framework=self.framework,
            framework_version=self.framework_version,
            cuda=self.cuda,
            python=self.python,
            os=self.os,
            platform=self.platform,
        )

    def as_dict(self) -> dict[str, Any]:
        """The public fields, as `plan --format json` prints them."""
        return {
            "id": self.id,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "nccl": self.nccl,
            "python": self.python,
            "os": self.os,
            "platform": self.platform,
            "base_image": self.base_image,
            "image": self.image,
            "packages": list(self.packages),
            "user": self.user,
            "bytecode": self.bytecode,
        }


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """A combination that will not be built, and why."""

    combination: Combination
    reason: str
    facts: tuple[Fact, ...] = ()  # the facts checked, the last one the failing one

    def as_dict(self) -> dict[str, Any]:
        """The known fields plus the reason."""
        return {**self.combination.as_dict(), "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What would be built and what cannot be."""

    entries: tuple[Entry, ...]
    excluded: tuple[Exclusion, ...]


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    """The HTTP(S) proxy envbuild and its builds use (envbuild.net.proxy chooses it); empty: none.

    The URLs may hold the proxy's password: kept out of reprs, registered with the redactor."""

    http: str | None = field(default=None, repr=False)
    https: str | None = field(default=None, repr=False)
    no_proxy: tuple[str, ...] = ()  # hosts, .domains, IPs, host:port, or "*"

    @property
    def empty(self) -> bool:
        """True when no proxy is set."""
        return self.http is None and self.https is None

    def environment(self) -> dict[str, str]:
        """The variables curl, apt, pip and uv read, in both cases (empty when no proxy)."""
        if self.empty:
            return {}
        found = {"HTTP_PROXY": self.http, "HTTPS_PROXY": self.https}
        if self.no_proxy:
            found["NO_PROXY"] = ",".join(self.no_proxy)
        env = {k: v for k, v in found.items() if v is not None}
        return {**env, **{k.lower(): v for k, v in env.items()}}


NO_FRAMEWORK_INDEX = "none"


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """How to fetch what a build needs; none of it may end up in the image."""

    base_image: str | None = None
    ca_bundle: Path | None = None
    wheelhouse: Path | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    # The framework's own index (PyTorch's): None for the entry's, NO_FRAMEWORK_INDEX for none
    # (--index-url serves the framework's wheels), else a mirror of it.
    framework_index: str | None = None
    offline: bool = False
    # Used by the host (uv, the registry client) and passed to builds as Docker's predefined
    # proxy arguments, which stay out of the history and the cache key.
    proxy: ProxySettings = field(default_factory=ProxySettings, repr=False)
    # The builder the Dockerfile is rendered for: CLASSIC or BUILDKIT (the CLI resolves AUTO
    # against the engine before anything is rendered).
    builder: str = CLASSIC


@dataclass(frozen=True, kw_only=True)
class BaseProbe:
    """What a base image holds: its OS and, if any, its python3."""

    ref: str
    image_id: str
    os_id: str
    os_codename: str
    python: str | None  # major.minor of python3 on PATH, None when absent
    platform: str = AMD64  # what the image's config records (core.platforms)


@dataclass(frozen=True, kw_only=True)
class Lock:
    """One entry's resolved environment: every distribution pinned with its hashes.

    `text` is the whole lock file as written beside the matrix (envbuild's header, then
    `uv pip compile --generate-hashes` output); it is what the image installs and keeps.
    """

    entry_id: str
    text: str
    path: Path | None = None  # where it was read from or written to; None for an ephemeral lock

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes: the image's lock label and the content hash's input."""
        return "sha256:" + hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ServedInputs:
    """What a build fetches from envbuild's build server (envbuild/build/server.py) while it
    runs: never in the context, the content hash, a build argument or the image."""

    ca_bundle: Path | None = None
    wheels: tuple[Path, ...] = ()  # the wheelhouse's regular files, offered as uv --find-links
    index_url: str | None = field(default=None, repr=False)  # may hold credentials
    extra_index_urls: tuple[str, ...] = field(default=(), repr=False)  # framework index last
    offline: bool = False  # uv --no-index: only the served wheels
    uv: Path | None = None  # the uv binary the install runs; None: the host's (find_uv)


@dataclass(frozen=True, kw_only=True)
class FrameworkImage:
    """The image an entry is built FROM when its lock has a framework part: the OS, Python, the
    image's user and that part (templates/framework.j2), one per key, shared by every entry
    with that key."""

    key: str  # sha256 hex of what decides its bytes (render.framework_key)
    ref: str  # envbuild/framework:<framework>-<version>-<key prefix>, on every engine
    dockerfile: str
    lock: str  # the lock's framework part: what the image must hold, exactly
    title: str  # "torch 2.4.1+cu121", as progress and reports name it

    @property
    def short(self) -> str:
        """The key as people read it."""
        return self.key[:12]


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """A rendered Dockerfile, the files it copies, and the hash that names the result."""

    entry: Entry
    base_image: str
    dockerfile: str
    runtime_stage: str  # the Dockerfile's `runtime` stage (OS + Python) on its own
    files: tuple[tuple[str, Path], ...]  # (path in context, source file)
    build_args: dict[str, str]  # never hashed, never written: may hold credentials
    content_hash: str
    labels: dict[str, str]
    offline: bool = False  # build with no route off the host: everything comes from it
    lock: Lock | None = None  # written as envbuild.lock; the image installs and keeps it
    served: ServedInputs = field(default_factory=ServedInputs)
    builder: str = CLASSIC  # the builder the Dockerfile was rendered for
    # The lock's framework part (lockfile.framework_part), written as framework.lock and installed
    # in layers below the rest; "" when the whole lock is one install.
    framework_lock: str = ""
    framework_image: FrameworkImage | None = None  # what the Dockerfile is built FROM
    # The CUDA libraries' pins of the first install (lockfile.cuda_part), written as cuda.lock and
    # installed lowest, from a COPY of their own; "" when it pins none.
    cuda_lock: str = ""


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    """An image that exists in the engine for an entry."""

    entry: Entry
    id: str
    tags: tuple[str, ...]
    built: bool  # False when an image with the same content hash already existed
    log_path: Path | None
    seconds: float
    tag_restored_from: str | None = None  # the image the entry's tag had been moved to
    framework: str = ""  # how its framework image was had: "framework torch … (key …): built"
