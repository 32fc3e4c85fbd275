"""Admission policies that let a cluster run only what envbuild vetted: images under the given
patterns, signed with envbuild's key, whose signed test-result says PASSED and whose signed
provenance names envbuild's build. Key-based and offline, like the signatures: no
transparency log, no certificate authority.

- Kyverno (1.13 or later): one ClusterPolicy, a `verifyImages` rule with a static-key attestor
  (`rekor.ignoreTlog`, `ctlog.ignoreSCT`: without them Kyverno asks the public Rekor and TUF,
  which an air-gapped cluster cannot reach) and two attestations whose conditions read the
  predicate's fields at the top level (`{{ result }}`), as Kyverno's engine adds the predicate
  to the JSON context (`pkg/engine/internal/imageverifier.go`, EvaluateConditions).
- sigstore policy-controller (v1beta1): two ClusterImagePolicies over the same images, since a
  pod must satisfy every policy that matches it but only one authority within a policy, and an
  authority with `attestations` checks `.att` alone, not `.sig` (`pkg/webhook/validator.go`,
  ValidatePolicy). A key authority without `ctlog` skips the transparency log
  (checkOptsFromAuthority: no Rekor client and no keys set IgnoreTlog). The attestation
  policies are CUE, unified with the in-toto Statement (`pkg/webhook/policy/eval.go`).

Image patterns are written as given: Kyverno's `imageReferences` match the whole reference with
its tag (`*` also crosses `/`); policy-controller's globs match the repository (`*` stays within
one path segment, `**` crosses them).

Sources (field names checked against the CRDs in tests/fixtures/policy-crds/): kyverno/kyverno
`api/kyverno/v1/image_verification_types.go`, `config/crds/kyverno/kyverno.io_clusterpolicies.yaml`
and kyverno.io/docs "Verify Images Rules"; sigstore/policy-controller
`pkg/apis/policy/v1beta1/clusterimagepolicy_types.go` and `_validation.go`,
`config/300-clusterimagepolicy.yaml`, `pkg/webhook/policy/attestation.go`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import yaml

from envbuild.core.errors import BadInput
from envbuild.core.names import shown
from envbuild.publish.attestations import BUILD_TYPE, BUILDER_ID, PASSED
from envbuild.publish.cosign import SLSA_PROVENANCE, TEST_RESULT

DEFAULT_NAME = "envbuild-vetted"
KYVERNO_TIMEOUT_S = 30  # Kyverno's most; each admission fetches signatures from the registry
MAX_NAME = 50  # a DNS label (63) less the suffixes of the policy-controller policies
# What an image reference holds, and the wildcards both controllers read. Anything else (space,
# brackets, a scheme, YAML punctuation) is a mistake a policy would carry silently.
_PATTERN = re.compile(r"[A-Za-z0-9._:/@*?-]+")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PEM = re.compile(r"-----BEGIN PUBLIC KEY-----\n[A-Za-z0-9+/=\n]+-----END PUBLIC KEY-----\n?")


def kyverno_policy(public_key_pem: str, images: Sequence[str], *, name: str = DEFAULT_NAME) -> str:
    """A Kyverno ClusterPolicy, as YAML, that admits images matching `images` only when signed
    with the key and attested PASSED and built by envbuild."""
    patterns = _checked(public_key_pem, images, name)
    attestor = {
        "count": 1,
        "entries": [
            {
                "keys": {
                    "publicKeys": public_key_pem,
                    "rekor": {"ignoreTlog": True},
                    "ctlog": {"ignoreSCT": True},
                }
            }
        ],
    }
    document = {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": name,
            "annotations": {
                "policies.kyverno.io/title": "Images vetted by envbuild",
                "policies.kyverno.io/description": (
                    "Pods may run images under these patterns only when signed with envbuild's "
                    "key, with a signed test-result of PASSED and a signed provenance of "
                    "envbuild's build."
                ),
            },
        },
        "spec": {
            # At admission only: a background scan would fetch every signature again.
            "background": False,
            "webhookConfiguration": {"failurePolicy": "Fail", "timeoutSeconds": KYVERNO_TIMEOUT_S},
            "rules": [
                {
                    "name": name,
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "verifyImages": [
                        {
                            "type": "Cosign",
                            "imageReferences": patterns,
                            "failureAction": "Enforce",
                            "mutateDigest": True,
                            "verifyDigest": True,
                            "required": True,
                            "attestors": [attestor],
                            "attestations": [
                                _kyverno_attestation(TEST_RESULT, attestor, {"result": PASSED}),
                                _kyverno_attestation(
                                    SLSA_PROVENANCE,
                                    attestor,
                                    {
                                        "buildDefinition.buildType": BUILD_TYPE,
                                        "runDetails.builder.id": BUILDER_ID,
                                    },
                                ),
                            ],
                        }
                    ],
                }
            ],
        },
    }
    return _dump([document], "Kyverno 1.13 or later")


def _kyverno_attestation(
    predicate_type: str, attestor: dict[str, Any], equal: dict[str, str]
) -> dict[str, Any]:
    """An attestation check: signed by `attestor`, and each predicate field equal to its value."""
    conditions = [
        {"key": f"{{{{ {field} }}}}", "operator": "Equals", "value": value}
        for field, value in equal.items()
    ]
    return {"type": predicate_type, "attestors": [attestor], "conditions": [{"all": conditions}]}


def policy_controller_policy(
    public_key_pem: str, images: Sequence[str], *, name: str = DEFAULT_NAME
) -> str:
    """Two sigstore policy-controller ClusterImagePolicies, as YAML: one for the image signature,
    one for the test-result (PASSED) and provenance (envbuild's build) attestations."""
    patterns = _checked(public_key_pem, images, name)
    key = {"data": public_key_pem}
    test_result = _cue(TEST_RESULT, {"result": PASSED})
    built = {
        "buildDefinition": {"buildType": BUILD_TYPE},
        "runDetails": {"builder": {"id": BUILDER_ID}},
    }
    provenance = _cue(SLSA_PROVENANCE, built)
    signed = _image_policy(f"{name}-signed", patterns, {"name": "envbuild-key", "key": key})
    vetted = _image_policy(
        f"{name}-attested",
        patterns,
        {
            "name": "envbuild-key",
            "key": key,
            "attestations": [
                {"name": "test-result", "predicateType": TEST_RESULT, "policy": test_result},
                {"name": "provenance", "predicateType": SLSA_PROVENANCE, "policy": provenance},
            ],
        },
    )
    return _dump(
        [signed, vetted], "sigstore policy-controller with the ClusterImagePolicy v1beta1 API"
    )


def _image_policy(name: str, patterns: list[str], authority: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy.sigstore.dev/v1beta1",
        "kind": "ClusterImagePolicy",
        "metadata": {"name": name},
        "spec": {
            "mode": "enforce",
            "images": [{"glob": pattern} for pattern in patterns],
            "authorities": [authority],
        },
    }


def _cue(predicate_type: str, predicate: dict[str, Any]) -> dict[str, str]:
    """A CUE policy the in-toto Statement must unify with. CUE's string and struct literals
    read JSON, so the values are written as JSON: no quoting of our own to get wrong."""
    body = f"predicateType: {json.dumps(predicate_type)}\npredicate: {json.dumps(predicate)}\n"
    return {"type": "cue", "data": body}


def _checked(public_key_pem: str, images: Sequence[str], name: str) -> list[str]:
    """The patterns, once the key, every pattern and the name are known to be usable."""
    if not _PEM.fullmatch(public_key_pem):
        msg = "the key is not one PEM public key; pass the .pub file `envbuild keys generate` wrote"
        raise BadInput(msg)
    if not images:
        msg = "no image pattern: pass --image PATTERN (e.g. --image 'registry.corp/ml/*')"
        raise BadInput(msg)
    for pattern in images:
        if not _PATTERN.fullmatch(pattern) or "://" in pattern:
            msg = (
                f"--image {shown(pattern)} is not an image pattern; write registry/repository "
                "with * or ? as wildcards, e.g. 'registry.corp/ml/*'"
            )
            raise BadInput(msg)
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        msg = (
            f"--name {shown(name)} is not a Kubernetes name; use at most {MAX_NAME} lowercase "
            "letters, digits and '-', starting and ending with a letter or digit"
        )
        raise BadInput(msg)
    return list(dict.fromkeys(images))


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the PEM, the CUE) as literal blocks, readable and exact,
    and each repeated part written out again rather than as an anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _dump(documents: list[dict[str, Any]], requires: str) -> str:
    header = (
        "# Written by `envbuild policy`: images under the patterns below are admitted only when\n"
        "# signed with envbuild's key and attested as passing their smoke test.\n"
        f"# Needs {requires}.\n"
    )
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, explicit_start=True)
    return header + body
