"""Who a payload runs as, and what that user may write; runs INSIDE the container.

envbuild's images run as a non-root user (templates/partials/user.j2) unless a matrix chose root.
The smoke payloads report here who they ran as, whether that user can write HOME and the cache
folders the image names, and whether it could change the installed environment (it must not: the
environment is root's); the host judges the report against the image's org.envbuild.user label
(envbuild/smoke/checks.py).

Standard library and the harness only, Python 3.8 and later.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from typing import Any

import smoke_harness as harness

# The folders the image's user must be able to write, where the image names them: HOME, XDG's
# cache (pip's, Hugging Face's and most tools'), and torch.compile's kernels (inductor's, triton's).
FOLDER_VARIABLES = ("HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
USER_TIMEOUT_S = 30


def user_part() -> dict[str, Any]:
    """The `user` part of the report before anything ran."""
    return {
        "uid": None,
        "gid": None,
        "name": None,
        "folders": {},
        "unwritable": {},
        "environment": None,
        "environment_writable": [],
    }


def run_user(part: dict[str, Any]) -> None:
    """Fill ``part``: the uid, gid and name this process runs as; each folder of FOLDER_VARIABLES
    that this user cannot write, with why (made first where missing, as the tools would); and the
    folders of the environment it could write into."""
    import pwd

    part["uid"], part["gid"] = os.getuid(), os.getgid()
    try:
        part["name"] = pwd.getpwuid(part["uid"]).pw_name
    except KeyError:  # a uid the image does not name, as a pod's runAsUser may choose
        part["name"] = None
    for variable in FOLDER_VARIABLES:
        path = os.environ.get(variable)
        if not path:
            continue
        part["folders"][variable] = path
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            part["unwritable"][variable] = harness.describe_exc(exc)
    paths = sysconfig.get_paths()
    part["environment"] = sys.prefix
    places = dict.fromkeys([sys.prefix, paths["purelib"], paths["platlib"], paths["scripts"]])
    part["environment_writable"] = [p for p in places if os.access(p, os.W_OK)]


def user_section(run: harness.Run) -> None:
    """The user section: who the payload runs as and what it may write."""
    run.section("user", USER_TIMEOUT_S, lambda doc: run_user(doc["user"]))
