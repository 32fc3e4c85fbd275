"""This host: its engine, NVIDIA driver and GPUs, shared memory and disk, for doctor and bench.

- `probes`: what the host has, read without the engine (nvidia-smi, NVML, /dev/shm, disk).
- `doctor`: `envbuild doctor`'s report: the probes and which images this host can run.
"""
