"""The compatibility knowledge base: facts with their sources, read from matrices/knowledge/.

- `load`: the knowledge base (CUDA, cuDNN, OS bases, GPUs, frameworks) as one `Knowledge`.
- `frameworks`: the framework files (torch.yaml, ...): releases, variants, indexes.
- `schema`: the checker that walks one file and collects every problem with its place.
- `refresh/`: the PyPI-derived facts of a framework file, refreshed from PyPI itself.
"""
