from tests.docker_support import (
    base_image,
    ca_bundle,
    docker_client,
    engine,
    isolated_data_dir,
    torch_cpu_build,
    wheelhouse,
)

__all__ = [
    "base_image",
    "ca_bundle",
    "docker_client",
    "engine",
    "isolated_data_dir",
    "torch_cpu_build",
    "wheelhouse",
]
