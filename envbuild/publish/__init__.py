"""Publish only vetted images, and show what a published image was vetted with.

- `push`: push a vetted image, read its digest back, attach its evidence, move its tags.
- `verify`: what the registry already holds for an entry, and `envbuild verify`.
- `evidence`: the OCI artifact (smoke report, package list, SBOM) beside an image's digest.
- `sbom`: the CycloneDX SBOM of an image's environment.
- `keys`: the ECDSA P-256 signing key (encrypted PKCS#8, from the environment) and public keys.
- `cosign`: the bytes cosign and the admission controllers read: the simple-signing payload,
  DSSE envelopes, in-toto statements; made and checked.
- `attestations`: what envbuild attests: the smoke verdict (test-result), SLSA provenance.
- `signing`: signatures and attestations at the `sha256-<hex>.sig`/`.att` tags, and verifying them.
- `policy`: Kyverno and sigstore policy-controller policies that admit only vetted images.
"""
