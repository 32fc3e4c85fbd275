"""From an entry and its lock to a built image.

- `render`: Entry + Lock → BuildContext (the Dockerfile from templates/, context files, hash,
  and the framework image it is built FROM, named by its key).
- `entry`: build one entry: check the base, skip what exists by content hash, have its framework
  image (built here before, found or pulled and checked, else built), build, tag.
- `server`: serve the build what it must use but the image must never hold, for its duration.
- `bootstrap`: a local base image made with debootstrap, for hosts that cannot pull.
"""
