"""The import layering, as drawn: data flows one way (DESIGN.md), and each module imports only
modules of a lower layer. A new module must be placed here; a new upward import fails.

A subpackage (envbuild/registry/, ...) counts as one module: its files may import each other,
and what they import from the rest of envbuild is checked against its layer."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "envbuild"

# Lower layers first. A module may import modules of lower layers only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("labels", "atomic"),
    ("__init__", "models", "redact", "references", "resources", "interrupt", "http_limits"),
    ("errors", "results", "bench_figures"),
    (
        "yamlfile",
        "credentials",
        "proxy",
        "trust",
        "store",
        "engine",
        "packages",
        "build_server",
        "wheelhouse",
        "sbom",
        "bench_advice",
        "bench_report",
    ),
    ("knowledge_schema", "versions", "bench_html"),
    ("knowledge_frameworks",),
    ("knowledge", "registry", "docker_engine", "base", "refresh"),
    ("gpu_compat", "uv_resolve"),
    ("compat", "render", "evidence", "lock", "smoke"),
    ("matrix_file", "published"),
    ("matrix",),
    ("ci_matrix", "doctor", "build", "report"),
    ("pipeline", "publish", "bench"),
    ("progress", "cli_options"),
    ("cli_maintenance", "cli_lock", "cli_bench"),
    ("cli",),
    ("__main__",),
)
# The engine interface's factory imports its implementation lazily, inside connect().
ALLOWED_UPWARD = {("engine", "docker_engine")}
# Libraries that only one module may import: the rest of envbuild stays free of them.
OWNED_LIBRARIES = {"docker": "docker_engine", "jinja2": "render", "matplotlib": "bench_html"}


def rank(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if module in layer:
            return index
    pytest.fail(f"envbuild/{module} is in no layer of tests/unit/test_layers.py; place it there")


def source(module: str) -> list[Path]:
    """The files of a module: envbuild/<module>.py, or every file of the subpackage."""
    package = PACKAGE / module
    if (package / "__init__.py").exists():
        return sorted(package.rglob("*.py"))
    return [PACKAGE / f"{module}.py"]


def is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()


def imports(*paths: Path) -> set[str]:
    """Top-level names imported anywhere in the files (function-level imports included)."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                if node.module == "envbuild":  # `from envbuild import cli` names a module
                    found.update(
                        f"envbuild.{alias.name}" for alias in node.names if is_module(alias.name)
                    )
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


SUBPACKAGES = sorted(
    p.parent.name for p in PACKAGE.glob("*/__init__.py") if p.parent.name != "payload"
)
MODULES = sorted([p.stem for p in PACKAGE.glob("*.py")] + SUBPACKAGES)


def test_every_module_has_a_layer() -> None:
    placed = {m for layer in LAYERS for m in layer}
    assert placed == set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_go_down_the_layers(module: str) -> None:
    upward = []
    for name in imports(*source(module)):
        parts = name.split(".")
        if parts[0] != "envbuild":
            continue
        target = parts[1] if len(parts) > 1 else "__init__"
        if target == "payload" or (module, target) in ALLOWED_UPWARD:
            continue
        if rank(target) >= rank(module) and target != module:
            upward.append(target)
    assert upward == [], f"envbuild/{module} imports from its own or a higher layer"


@pytest.mark.parametrize("module", MODULES)
def test_owned_libraries_stay_in_their_module(module: str) -> None:
    used = {name.split(".")[0] for name in imports(*source(module))}
    strays = [lib for lib, owner in OWNED_LIBRARIES.items() if lib in used and module != owner]
    assert strays == []


@pytest.mark.parametrize(
    "payload", sorted((PACKAGE / "payload").glob("*.py")), ids=lambda p: p.name
)
def test_payloads_import_only_the_stdlib_their_framework_and_the_harness(payload: Path) -> None:
    # They run inside images that hold Python, the framework and nothing of envbuild.
    allowed = set(sys.stdlib_module_names) | {"torch", "tensorflow", "jax", "jaxlib", "numpy", "smoke_harness", "bench_harness", "torch_smoke", "tensorflow_smoke", "jax_smoke", "keras", "optax", "flax"}  # fmt: skip
    foreign = sorted(n for n in imports(payload) if n.split(".")[0] not in allowed)
    assert foreign == []
