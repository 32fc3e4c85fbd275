"""Publish only vetted images, and show what a published image was vetted with.

- `push`: push a vetted image, read its digest back, attach its evidence, move its tags.
- `verify`: what the registry already holds for an entry, and `envbuild verify`.
- `evidence`: the OCI artifact (smoke report, package list, SBOM) beside an image's digest.
- `sbom`: the CycloneDX SBOM of an image's environment.
"""
