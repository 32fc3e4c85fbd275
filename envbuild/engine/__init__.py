"""The container engine: what envbuild asks of one, and its one real implementation.

- `interface`: the `Engine` Protocol, what it answers with, and `connect()`, which imports the
  docker-py implementation only when called (commands that need no engine never load docker).
- `docker_engine`: the docker-py implementation, the only module that imports docker; every
  failure of the engine's answers leaves it as one EngineFailed line, worded there in one place.
- `leftovers`: which stopped envbuild containers a dead run left behind, decided without the
  engine (its probes are injected), so every rule is a unit test.
"""
