"""The `org.envbuild.*` label keys: the templates write them and every reader looks them up here."""

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
STAGE = PREFIX + "stage"  # "builder" on the stage that installs the environment
VERSION = PREFIX + "version"  # the envbuild that built the image
# The image's content hash; inherited by images built FROM it.
CONTENT_HASH = PREFIX + "content-hash"

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
}
