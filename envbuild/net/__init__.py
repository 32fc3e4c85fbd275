"""envbuild's own HTTP: bounded against hostile servers, routed through the chosen proxy, trusting
the chosen CAs, with credentials looked up the way Docker does.

- `bounded/`: body caps, deadlines that hold inside one socket read, origins, redirects and one
  retry policy for every client.
- `proxy`: which proxy envbuild and its builds use, and which hosts bypass it.
- `trust`: which CAs envbuild's HTTPS requests trust (the default store and `--ca-bundle`).
- `credentials`: registry credentials from the environment or Docker's config.
"""
