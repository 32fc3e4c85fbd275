"""envbuild: GPU training images built from a compatibility matrix and proven to train."""

__version__ = "0.1.0"
