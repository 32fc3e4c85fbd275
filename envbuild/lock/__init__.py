"""Locks: each entry's environment resolved on the host, pinned with hashes, for the image's platform.

- `lockfile`: lock files (their header, inputs digest, fresh/stale/missing) and updating them.
- `uv`: resolving one entry with uv, bounded in time and output.
- `wheelhouse`: a folder of wheels, and the framework index it stands in for.
- `planning`: each entry's lock state for plan and build, and the locks a build installs.
"""

# Entries resolved at the same time, by default (`envbuild lock --jobs`, and a build's locks).
MAX_JOBS = 8
