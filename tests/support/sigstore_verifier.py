"""An independent verifier of cosign signatures: Debian trixie's skopeo (containers/image 5.34),
set up by scripts/skopeo-sigstore.sh (bookworm's skopeo has sigstore verification patched out).

`skopeo copy` under a policy.json that requires a `sigstoreSigned` signature by a key, with
`use-sigstore-attachments` on for the registry, succeeds only for an image whose cosign signature
verifies with that key and names its repository.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

DEFAULT = Path("/opt/envbuild/skopeo-trixie/skopeo")
SETUP = "bash scripts/skopeo-sigstore.sh"


def skopeo_sigstore() -> str:
    """The wrapper's path; an AssertionError naming the set-up command when it is missing."""
    path = Path(os.environ.get("ENVBUILD_SKOPEO_SIGSTORE", DEFAULT))
    assert path.is_file(), f"{path} is missing; run `{SETUP}` (scripts/host-setup.sh does)"
    return str(path)


def skopeo_accepts(
    folder: Path, host: str, repository: str, digest: str, public_key: Path
) -> subprocess.CompletedProcess[str]:
    """Copy host/repository@digest to a local dir under a policy that requires a signature by
    `public_key` for that repository; the finished process (returncode 0: accepted)."""
    policy = {
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                f"{host}/{repository}": [
                    {
                        "type": "sigstoreSigned",
                        "keyPath": str(public_key),
                        "signedIdentity": {"type": "matchRepository"},
                    }
                ]
            }
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.json").write_text(json.dumps(policy))
    registries = folder / "registries.d"
    registries.mkdir(exist_ok=True)
    (registries / "envbuild-test.yaml").write_text(
        f"docker:\n  {host}:\n    use-sigstore-attachments: true\n"
    )
    out = folder / f"copy-{digest[7:19]}"
    return subprocess.run(
        [
            skopeo_sigstore(), "--policy", str(folder / "policy.json"),
            "--registries.d", str(registries), "copy", "--src-tls-verify=false",
            f"docker://{host}/{repository}@{digest}", f"dir:{out}",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
