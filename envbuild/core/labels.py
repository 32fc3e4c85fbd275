"""The names envbuild marks images and builds with: the `org.envbuild.*` label keys and the build
argument of the build server. The templates write them and every reader looks them up here."""

from __future__ import annotations

PREFIX = "org.envbuild."
ENTRY_ID = PREFIX + "entry-id"
FRAMEWORK = PREFIX + "framework"
FRAMEWORK_VERSION = PREFIX + "framework-version"
CUDA = PREFIX + "cuda"
CUDNN = PREFIX + "cudnn"
NCCL = PREFIX + "nccl"
PYTHON = PREFIX + "python"
OS = PREFIX + "os"
# "install" while the environment is installed, so that the container of that step, left by an
# engine that died mid-build, is found again; "image" on the finished image (and what it runs).
STAGE = PREFIX + "stage"
INSTALL_STAGE = STAGE + "=install"
# sha256 of the envbuild.lock the image installed (and keeps at /opt/venv/envbuild.lock).
LOCK_DIGEST = PREFIX + "lock-digest"
VERSION = PREFIX + "version"  # the envbuild that built the image
# The platform the image is for (linux/amd64, linux/arm64), beside what its config records.
PLATFORM = PREFIX + "platform"
# On a framework image (templates/framework.j2): its key, the sha256 of what decides its bytes;
# inherited by the entries' images built FROM it, so each names the framework it holds.
FRAMEWORK_KEY = PREFIX + "framework-key"
# The image's content hash; inherited by images built FROM it.
CONTENT_HASH = PREFIX + "content-hash"
# The uid:gid the image runs as ("1000:1000", or "0:0" for a matrix's `user: root`): the smoke
# test checks that its payload ran as it, with HOME and the caches writable and the environment not.
USER = PREFIX + "user"
# The `docker run` options the image needs to train as its smoke test did: the size of
# /dev/shm, through which torch's DataLoader workers hand batches over (Docker's default is 64 MB).
RUN_SHM_SIZE = PREFIX + "run.shm-size"
# What torch images declare: room for two workers' prefetched batches with a margin.
TORCH_SHM_SIZE = "1g"

# The build argument that carries the build server's URL to the install RUN (install.j2), and so
# into the environment of its container (where the engine's leftover policy reads it back).
SERVE_ARG = "ENVBUILD_SERVE"

# The keys as the templates see them: `{{ label.framework }}`.
TEMPLATE_KEYS: dict[str, str] = {
    "entry_id": ENTRY_ID,
    "framework": FRAMEWORK,
    "framework_version": FRAMEWORK_VERSION,
    "cuda": CUDA,
    "cudnn": CUDNN,
    "nccl": NCCL,
    "python": PYTHON,
    "os": OS,
    "stage": STAGE,
    "lock_digest": LOCK_DIGEST,
    "run_shm_size": RUN_SHM_SIZE,
    "user": USER,
}
