"""From a matrix file to a plan: which entries to build, and which combinations cannot be, and why.

- `matrix_file`: read and validate a matrix file (every problem collected, with its place).
- `matrix`: expand a matrix under the rules into entries and exclusions; selection.
- `compat`: the compatibility rules, each a pure function returning a `Fact` with its source.
- `gpus`: the GPU rules (which compute capabilities a build has kernels for) and GPU names.
- `packages`: the team's packages (PEP 508 requirements), checked and normalised.
- `ci_matrix`: a plan as a GitHub Actions `strategy.matrix`.
"""
