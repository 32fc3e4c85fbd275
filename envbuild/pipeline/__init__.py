"""Many entries through the stages: build, smoke-test, record, and publish what passed.

- `entries`: shared stages first, then N entries at a time, each built and smoke-tested.
- `runs`: one `envbuild build` run: the entries, their reports, and the push of what passed.
"""
