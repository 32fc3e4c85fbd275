"""The command line: parse options, call the stages, turn errors into exit codes.

Heavy modules (docker, jinja2, the knowledge base) are imported inside the commands, so that
`envbuild --help` starts fast.

- `main`: the command group and the commands of the main flow.
- `options`: the options commands share, checked; the wrapper that maps errors to exit codes.
- `lock`, `bench`, `maintenance`: their command groups; `signing`: `keys generate`, `policy`.
- `progress`: the live view of a build run.
"""
