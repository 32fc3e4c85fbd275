"""The import layering, as drawn: data flows one way (DESIGN.md), and each package of envbuild
imports only packages of a lower layer. A new package must be placed here; an upward import fails.

Inside a package, modules may import each other, but not in a cycle when they load."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "envbuild"

# Lower layers first: the stages in the order data flows through them (README, Layout).
# A package may import packages of lower layers only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "core"),
    ("net", "report"),
    ("registry", "knowledge"),
    ("plan", "engine"),
    ("lock", "host"),
    ("build",),
    ("smoke",),
    ("publish",),
    ("bench", "pipeline"),
    ("cli",),
    ("__main__",),
)
# Libraries that only one module may import: the rest of envbuild stays free of them.
OWNED_LIBRARIES = {
    "docker": "engine/docker_engine.py",
    "jinja2": "build/render.py",
    "matplotlib": "bench/html/plots.py",
}
# What runs inside containers: stdlib and the framework only, imported by bare name there.
PAYLOAD = "payload"


def rank(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    pytest.fail(f"envbuild/{package} is in no layer of tests/unit/test_layers.py; place it there")


def files(package: str) -> list[Path]:
    """The files of a package (every file of its folder), or envbuild/<name>.py."""
    folder = PACKAGE / package
    if (folder / "__init__.py").exists():
        return sorted(folder.rglob("*.py"))
    return [PACKAGE / f"{package}.py"]


def is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(*paths: Path) -> set[str]:
    """Dotted names imported anywhere in the files (function-level imports included)."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                # `from envbuild.core import labels` names a module
                found.update(
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if is_module(f"{node.module}.{alias.name}")
                )
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


def imports_at_load(path: Path) -> set[str]:
    """Dotted names a module imports when it loads: its top-level imports, not those inside
    functions (imported when called) nor under `if TYPE_CHECKING:` (never at run time)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def dotted(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PACKAGES = sorted(
    [p.parent.name for p in PACKAGE.glob("*/__init__.py") if p.parent.name != PAYLOAD]
    + [p.stem for p in PACKAGE.glob("*.py")]
)
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if PAYLOAD not in p.relative_to(PACKAGE).parts)


def test_every_package_has_a_layer() -> None:
    placed = {m for layer in LAYERS for m in layer}
    assert placed == set(PACKAGES)


def test_no_module_sits_flat_beside_the_packages() -> None:
    # A module of its own at the top is a stage without a folder.
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == ["__init__", "__main__"]


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_down_the_layers(package: str) -> None:
    upward = set()
    for name in imports(*files(package)):
        parts = name.split(".")
        if parts[0] != "envbuild":
            continue
        target = parts[1] if len(parts) > 1 else "__init__"
        if target in (package, PAYLOAD):
            continue
        if target == "__version__":
            target = "__init__"
        if rank(target) >= rank(package):
            upward.add(target)
    assert sorted(upward) == [], f"envbuild/{package} imports from its own or a higher layer"


@pytest.mark.parametrize("package", [p for p in PACKAGES if (PACKAGE / p).is_dir()])
def test_no_import_cycle_inside_a_package(package: str) -> None:
    graph = {
        dotted(path): {n for n in imports_at_load(path) if n.startswith(f"envbuild.{package}.")}
        for path in files(package)
    }
    modules = set(graph)
    graph = {m: {n for n in targets if n in modules and n != m} for m, targets in graph.items()}
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> None:
        if module in trail:
            pytest.fail("import cycle: " + " -> ".join((*trail[trail.index(module) :], module)))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, (*trail, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_owned_libraries_stay_in_their_module(module: Path) -> None:
    used = {name.split(".")[0] for name in imports(module)}
    here = module.relative_to(PACKAGE).as_posix()
    strays = [lib for lib, owner in OWNED_LIBRARIES.items() if lib in used and here != owner]
    assert strays == []


def test_each_owner_exists() -> None:
    assert [o for o in OWNED_LIBRARIES.values() if not (PACKAGE / o).is_file()] == []


@pytest.mark.parametrize("payload", sorted((PACKAGE / PAYLOAD).glob("*.py")), ids=lambda p: p.name)
def test_payloads_import_only_the_stdlib_their_framework_and_the_harness(payload: Path) -> None:
    # They run inside images that hold Python, the framework and nothing of envbuild.
    siblings = {p.stem for p in (PACKAGE / PAYLOAD).glob("*.py")}
    allowed = set(sys.stdlib_module_names) | siblings | {"torch", "tensorflow", "jax", "jaxlib", "numpy", "keras", "optax", "flax"}  # fmt: skip
    foreign = sorted(n for n in imports(payload) if n.split(".")[0] not in allowed)
    assert foreign == []
