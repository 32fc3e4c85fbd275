from tests.docker_support import (
    base_image,
    ca_bundle,
    docker_client,
    engine,
    isolated_data_dir,
    wheelhouse,
)

__all__ = ["base_image", "ca_bundle", "docker_client", "engine", "isolated_data_dir", "wheelhouse"]
