"""The one way to run a payload in a container, for the smoke test and the bench alike.

A payload is a script of envbuild/payload/ that prints one JSON document. The runner copies
the payload folder whole into a fresh container of the image (the script imports its harness
and companions by bare name, from its own folder), runs it under the image's declared run
options (`docker run` as a user would type it) and GNU timeout inside the container, and reads
the document back. What it does not know is refused with one line: an image envbuild did not
build, a framework it has no payload for, a GPU choice it does not offer.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput, SmokeFailed
from envbuild.core.models import GPU_CHOICES
from envbuild.core.resources import payload_dir
from envbuild.engine.interface import Engine, ImageInfo, RunResult

# Where the payload folder goes in the container.
PAYLOAD_DIR = "/tmp/envbuild-smoke"
FRAMEWORKS = ("torch", "tensorflow", "jax")
# Seconds GNU timeout waits after its TERM before it KILLs the payload.
_KILL_AFTER_S = 10
# A line that opens a JSON object, and how many of the last ones are tried as a report's start.
_OBJECT_LINE = re.compile(r"\n\{")
_MAX_STARTS = 16
# Seconds the host waits beyond the container's own limit before it gives up on the engine.
_HOST_MARGIN_S = 30


@dataclass(frozen=True, kw_only=True)
class PayloadRun:
    """One payload's run: its JSON document (None when it printed none) and how the run went."""

    report: dict[str, Any] | None
    result: RunResult
    gpus: bool
    seconds: float
    payload_digest: str  # of the files copied in: what ran, for the signed verdict

    def missing(self, what: str) -> str:
        """Why `what` (e.g. "the payload") left no report: the one line for every payload."""
        timed_out = self.result.timed_out or self.result.exit_code == 124
        why = "timed out" if timed_out else f"exited {self.result.exit_code}"
        return f"{what} {why} without a JSON report; stderr: {self.result.stderr.strip()[-400:]}"


def local_image(engine: Engine, ref: str) -> ImageInfo:
    """The image `ref` in the local engine; BadInput naming the fix when it is not there."""
    image = engine.image(ref)
    if image is None:
        msg = f"image {ref} is not in the local engine; build it (`envbuild build`) or pull it"
        raise BadInput(msg)
    return image


def image_framework(image: ImageInfo, ref: str, *, kind: str) -> str:
    """The framework an envbuild image was built with, which picks its `kind` payload."""
    framework = image.labels.get(label_keys.FRAMEWORK)
    if framework is None:
        msg = (
            f"image {ref} has no {label_keys.FRAMEWORK} label: {kind} runs in images envbuild "
            f"built ({', '.join(FRAMEWORKS)}); build one with `envbuild build`"
        )
        raise BadInput(msg)
    if framework not in FRAMEWORKS:
        msg = (
            f"image {ref}: envbuild has no {kind} payload for framework {framework!r} "
            f"(it has them for {', '.join(FRAMEWORKS)})"
        )
        raise BadInput(msg)
    return framework


def wants_gpus(engine: Engine, gpus: str) -> bool:
    """Whether a run gets the GPUs: `all`, `none`, or `auto` (where the engine has NVIDIA's runtime)."""
    if gpus not in GPU_CHOICES:
        msg = f"--gpus {gpus}: choose one of {', '.join(GPU_CHOICES)}"
        raise BadInput(msg)
    return gpus == "all" or (gpus == "auto" and engine.has_nvidia_runtime())


def payload_files(script: str) -> tuple[str, dict[str, bytes]]:
    """Where `script` (e.g. torch_smoke.py) lands in the container, and the files copied in:
    the payload folder whole, so that the script finds its harness and companions (sys.path[0])."""
    folder = payload_dir()
    if not (folder / script).is_file():
        msg = f"envbuild's payload {folder / script} is missing; reinstall envbuild"
        raise SmokeFailed(msg)
    files = {
        f"{PAYLOAD_DIR}/{path.name}": path.read_bytes() for path in sorted(folder.glob("*.py"))
    }
    return f"{PAYLOAD_DIR}/{script}", files


def read_report(stdout: str) -> dict[str, Any] | None:
    """The payload's one JSON document: its whole output, or else what follows one of the last
    lines that open a JSON object (a payload writes its report last, after nothing or noise)."""
    text = stdout.strip()
    opens = [match.start() + 1 for match in _OBJECT_LINE.finditer(text)]
    for start in [0, *reversed(opens[-_MAX_STARTS:])]:
        try:
            value = json.loads(text[start:])
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_payload(
    engine: Engine,
    image: ImageInfo,
    ref: str,
    script: str,
    *,
    args: tuple[str, ...] = (),
    gpus: bool,
    timeout_s: float,
    environment: dict[str, str] | None = None,
) -> PayloadRun:
    """Run `script` of the payload folder in a fresh container of `ref`, under the run options
    the image declares and GNU timeout inside the container (which stops a hung payload even if
    the host side is interrupted); the container is removed whatever happens."""
    target, files = payload_files(script)
    limit = str(int(timeout_s))
    command = ["timeout", "-k", str(_KILL_AFTER_S), limit, "python3", target, *args]
    start = time.monotonic()
    result = engine.run(
        ref,
        command,
        timeout=timeout_s + _HOST_MARGIN_S,
        files=files,
        gpus=gpus,
        shm_size=image.labels.get(label_keys.RUN_SHM_SIZE) or None,
        environment=environment,
    )
    return PayloadRun(
        report=read_report(result.stdout),
        result=result,
        gpus=gpus,
        seconds=time.monotonic() - start,
        payload_digest=files_digest(files),
    )


def files_digest(files: dict[str, bytes]) -> str:
    """One sha256 over a payload's files, names and contents, in name order."""
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        digest.update(b"%d:%s\0%d:" % (len(name), name.encode(), len(data)))
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def docker_run_flags(labels: dict[str, str], *, gpus: bool) -> str:
    """The `docker run` options a payload ran under, for users to run the image alike."""
    flags = ["--gpus all"] if gpus else []
    shm_size = labels.get(label_keys.RUN_SHM_SIZE)
    if shm_size:
        flags.append(f"--shm-size={shm_size}")
    return " ".join(flags)
