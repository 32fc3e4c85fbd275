"""From an entry and its lock to a built image.

- `render`: Entry + Lock → BuildContext (the Dockerfile from templates/, context files, hash).
- `entry`: build one entry: check the base, skip what exists by content hash, build, tag.
- `server`: serve the build what it must use but the image must never hold, for its duration.
- `bootstrap`: a local base image made with debootstrap, for hosts that cannot pull.
"""
