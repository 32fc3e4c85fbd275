"""Prove an image trains: run a payload inside it, and check what it reports.

- `runner`: the one way to run a payload in a container, for smoke and bench alike: its files,
  the GPUs it gets, its time limit and the one JSON document it prints.
- `checks`: the smoke report checked against the image's labels, section by section.
- `static`: the GPU-less proofs of a CUDA image (libraries resolve, versions, compiled archs).
"""
