from tests.docker_support import base_image, ca_bundle, docker_client, engine, wheelhouse

__all__ = ["base_image", "ca_bundle", "docker_client", "engine", "wheelhouse"]
