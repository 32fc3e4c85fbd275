"""Admission policies: every document envbuild writes validates against its controller's own CRD
schema (unknown fields refused, as the API server prunes or refuses them), carries the given key
exactly, checks what envbuild attests, and bad input is one line."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.core.errors import BadInput
from envbuild.publish import policy
from envbuild.publish.attestations import BUILD_TYPE, BUILDER_ID
from envbuild.publish.cosign import SLSA_PROVENANCE, TEST_RESULT
from envbuild.publish.keys import public_pem

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "policy-crds"
SCHEMAS = {
    "kyverno.io/v1/ClusterPolicy": "kyverno-clusterpolicy-v1.yaml",
    "policy.sigstore.dev/v1beta1/ClusterImagePolicy": "policy-controller-clusterimagepolicy-v1beta1.yaml",
}
Writer = Callable[..., str]
WRITERS: dict[str, Writer] = {
    "kyverno": policy.kyverno_policy,
    "policy-controller": policy.policy_controller_policy,
}
PATTERN_SETS = (["registry.corp/ml/*"], ["registry.corp/ml/torch", "ghcr.io/team/**", "r:5000/x?"])


@pytest.fixture(scope="module")
def pem() -> str:
    return public_pem(ec.generate_private_key(ec.SECP256R1()).public_key()).decode("ascii")


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema as the fixture holds it (see tests/fixtures/policy-crds)."""
    loaded = yaml.safe_load((CRDS / SCHEMAS[kind]).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def as_json_schema(node: Any, *, root: bool = False) -> Any:
    """A CRD structural schema read as the API server reads it: unknown fields refused unless
    the schema preserves them; a pruned subtree refuses any value (README.md)."""
    if not isinstance(node, dict):
        return node
    if node.get("x-envbuild-pruned"):
        return False
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            converted[key] = {name: as_json_schema(child) for name, child in value.items()}
        elif key in ("items", "not", "additionalProperties"):
            converted[key] = as_json_schema(value)
        elif not key.startswith("x-"):
            converted[key] = value
    preserved = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in node and "additionalProperties" not in node and not preserved:
        converted["additionalProperties"] = False
    if root:  # every custom resource has these; the server validates ObjectMeta itself
        implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
        converted["properties"] = {
            **converted["properties"],
            **implicit,
            "metadata": {"type": "object"},
        }
    return converted


def schema_errors(document: dict[str, Any]) -> list[str]:
    kind = f"{document['apiVersion']}/{document['kind']}"
    validator = jsonschema.Draft202012Validator(as_json_schema(crd_schema(kind), root=True))
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def undeclared(document: Any, schema: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """The paths of the field names in `document` that `schema` does not declare, read from the
    CRD's own properties (so also below fields the CRD lets hold anything)."""
    if isinstance(document, dict):
        properties = schema.get("properties") if isinstance(schema, dict) else None
        values = schema.get("additionalProperties") if isinstance(schema, dict) else None
        for key, value in document.items():
            if path == () and key in ("apiVersion", "kind", "metadata"):
                continue
            if properties is not None and key in properties:
                yield from undeclared(value, properties[key], (*path, key))
            elif isinstance(values, dict):
                yield from undeclared(value, values, (*path, key))
            else:
                yield "/".join((*path, key))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            items = schema.get("items", {}) if isinstance(schema, dict) else {}
            yield from undeclared(item, items, (*path, str(index)))


def key_paths(document: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every field name in `document`, below `metadata` excepted."""
    if isinstance(document, dict):
        for key, value in document.items():
            if path == () and key in ("apiVersion", "kind", "metadata"):
                continue
            yield (*path, key)
            yield from key_paths(value, (*path, key))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from key_paths(item, (*path, index))


def documents(text: str) -> list[dict[str, Any]]:
    loaded = [d for d in yaml.safe_load_all(text) if d is not None]
    assert loaded
    assert all(isinstance(d, dict) for d in loaded)
    return loaded


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("patterns", PATTERN_SETS, ids=["one", "several"])
def test_every_document_validates_against_its_crd(kind: str, patterns: list[str], pem: str) -> None:
    for document in documents(WRITERS[kind](pem, patterns)):
        assert schema_errors(document) == []
        assert (
            list(undeclared(document, crd_schema(f"{document['apiVersion']}/{document['kind']}")))
            == []
        )


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_misspelled_field_anywhere_is_refused_by_the_schema(kind: str, pem: str) -> None:
    """Each field name envbuild writes, cut by its last letter: the schema must refuse every
    one, or a typo in the policy would reach the cluster and be dropped there."""
    checked = 0
    for document in documents(WRITERS[kind](pem, ["registry.corp/ml/*"])):
        for path in key_paths(document):
            broken = copy.deepcopy(document)
            parent = broken
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1][:-1]] = parent.pop(path[-1])
            assert schema_errors(broken), f"{'/'.join(map(str, path))} misspelled passes the schema"
            checked += 1
    assert checked > 20


def test_a_field_in_a_pruned_part_of_the_schema_is_refused(pem: str) -> None:
    (document,) = documents(policy.kyverno_policy(pem, ["registry.corp/ml/*"]))
    assert schema_errors(document) == []
    document["spec"]["rules"][0]["mutate"] = {}
    assert schema_errors(document) == ["spec/rules/0: False schema does not allow {}"]


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_the_key_in_the_policy_is_exactly_the_given_key(kind: str, pem: str) -> None:
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if (
                    key in ("publicKeys", "data")
                    and isinstance(value, str)
                    and "PUBLIC KEY" in value
                ):
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for document in documents(WRITERS[kind](pem, ["registry.corp/ml/*"])):
        walk(document)
    assert found
    assert set(found) == {pem}


def test_kyverno_checks_the_signature_and_both_attestations_offline(pem: str) -> None:
    (document,) = documents(
        policy.kyverno_policy(pem, ["registry.corp/ml/*", "r.io/x"], name="vetted")
    )
    assert document["metadata"]["name"] == "vetted"
    (rule,) = document["spec"]["rules"]
    (check,) = rule["verifyImages"]
    assert check["imageReferences"] == ["registry.corp/ml/*", "r.io/x"]
    assert (
        check["failureAction"],
        check["mutateDigest"],
        check["verifyDigest"],
        check["required"],
    ) == (
        "Enforce",
        True,
        True,
        True,
    )
    attestors = [check["attestors"], *(a["attestors"] for a in check["attestations"])]
    for attestor in attestors:
        (entry,) = attestor[0]["entries"]
        assert entry["keys"]["rekor"] == {"ignoreTlog": True}
        assert entry["keys"]["ctlog"] == {"ignoreSCT": True}
        assert attestor[0]["count"] <= len(attestor[0]["entries"])  # Kyverno's own rule
    conditions = {
        attestation["type"]: {
            (c["key"], c["operator"], c["value"]) for c in attestation["conditions"][0]["all"]
        }
        for attestation in check["attestations"]
    }
    assert conditions == {
        TEST_RESULT: {("{{ result }}", "Equals", "PASSED")},
        SLSA_PROVENANCE: {
            ("{{ buildDefinition.buildType }}", "Equals", BUILD_TYPE),
            ("{{ runDetails.builder.id }}", "Equals", BUILDER_ID),
        },
    }


def test_policy_controller_requires_the_signature_and_the_attestations_in_two_policies(
    pem: str,
) -> None:
    signed, attested = documents(policy.policy_controller_policy(pem, ["registry.corp/ml/**"]))
    assert [signed["metadata"]["name"], attested["metadata"]["name"]] == [
        "envbuild-vetted-signed",
        "envbuild-vetted-attested",
    ]
    for document in (signed, attested):
        assert document["spec"]["mode"] == "enforce"
        assert document["spec"]["images"] == [{"glob": "registry.corp/ml/**"}]
        (authority,) = document["spec"]["authorities"]
        assert "ctlog" not in authority  # no ctlog: policy-controller skips the transparency log
        assert set(authority["key"]) == {"data"}
    assert "attestations" not in signed["spec"]["authorities"][0]  # so it checks .sig
    attestations = attested["spec"]["authorities"][0]["attestations"]
    assert [(a["name"], a["predicateType"]) for a in attestations] == [
        ("test-result", TEST_RESULT),
        ("provenance", SLSA_PROVENANCE),
    ]
    policies = {a["predicateType"]: cue_fields(a["policy"]) for a in attestations}
    assert policies[TEST_RESULT] == {
        "predicateType": TEST_RESULT,
        "predicate": {"result": "PASSED"},
    }
    assert policies[SLSA_PROVENANCE] == {
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {"buildType": BUILD_TYPE},
            "runDetails": {"builder": {"id": BUILDER_ID}},
        },
    }


def cue_fields(policy_spec: dict[str, str]) -> dict[str, Any]:
    """The CUE policy's top-level fields, each a JSON literal (the form policy.py writes)."""
    assert policy_spec["type"] == "cue"
    fields = {}
    for line in policy_spec["data"].splitlines():
        label, _, value = line.partition(": ")
        fields[label] = json.loads(value)
    return fields


def test_repeated_patterns_are_written_once(pem: str) -> None:
    (document,) = documents(policy.kyverno_policy(pem, ["a.io/x", "a.io/x", "b.io/y"]))
    assert document["spec"]["rules"][0]["verifyImages"][0]["imageReferences"] == [
        "a.io/x",
        "b.io/y",
    ]


BAD_PATTERNS = [
    "",
    " ",
    "registry.corp/ml/*\n",
    "registry.corp/ml torch",
    "registry.corp/ml/[a-z]",
    "https://registry.corp/ml/*",
    "registry.corp\\ml",
    "régistry.corp/ml",
    "registry.corp/ml/*\x00",
    "reg/{{ request.object }}",
    "reg/x # comment",
]


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("pattern", BAD_PATTERNS)
def test_a_pattern_that_is_not_an_image_pattern_is_one_line(
    kind: str, pattern: str, pem: str
) -> None:
    with pytest.raises(BadInput, match="is not an image pattern") as raised:
        WRITERS[kind](pem, ["registry.corp/ok/*", pattern])
    assert "\n" not in raised.value.message


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("patterns", [[], ()], ids=["list", "tuple"])
def test_no_pattern_is_one_line(kind: str, patterns: list[str], pem: str) -> None:
    with pytest.raises(BadInput, match="no image pattern: pass --image PATTERN"):
        WRITERS[kind](pem, patterns)


BAD_NAMES = [
    "",
    "Vetted",
    "-vetted",
    "vetted-",
    "vet ted",
    "vetted.prod",
    "v" * (policy.MAX_NAME + 1),
    "ü",
]


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_kubernetes_would_refuse_is_one_line(kind: str, name: str, pem: str) -> None:
    with pytest.raises(BadInput, match="is not a Kubernetes name") as raised:
        WRITERS[kind](pem, ["registry.corp/ml/*"], name=name)
    assert "\n" not in raised.value.message


def bad_keys(pem: str) -> list[str]:
    private = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n"
    return [
        "",
        private,
        pem + pem,
        pem.replace("PUBLIC KEY", "CERTIFICATE"),
        pem + "extra: field\n",
        pem.replace("\n", "\r\n"),
        "publicKeys: " + pem,
    ]


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("case", range(7))
def test_text_that_is_not_one_pem_public_key_is_refused(kind: str, case: int, pem: str) -> None:
    with pytest.raises(BadInput, match="not one PEM public key"):
        WRITERS[kind](bad_keys(pem)[case], ["registry.corp/ml/*"])
