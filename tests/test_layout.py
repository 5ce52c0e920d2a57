"""The package's shape, checked from its own imports: no import cycles between modules, no package
importing a package above it, and no function-local imports of our own modules (they hide cycles)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "widenet_ds"

# Each package may import only from packages of a lower layer (and from itself).
# `vision` is a domain package beside `model` (its config, model, datasets, loader, augmentation), which the
# checkpoint stack registers; only its trainer, `vision.train`, sits with the training loops.
LAYERS = [
    {"widenet_ds", "widenet_ds.errors", "widenet_ds.atomic", "widenet_ds.writable", "widenet_ds.run_folder"},
    {"widenet_ds.data", "widenet_ds.tasks", "widenet_ds.model", "widenet_ds.runtime", "widenet_ds.vision"},
    {"widenet_ds.checkpoint", "widenet_ds.params"},
    {"widenet_ds.training", "widenet_ds.report"},
    {"widenet_ds.cli", "widenet_ds.train", "widenet_ds.demo"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def own_imports(tree: ast.Module, known: set[str]) -> list[tuple[str, bool]]:
    """(imported module, imported at module level?) for every import of a widenet_ds module."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("widenet_ds"):
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("widenet_ds")]
        found += [(name, id(node) in top) for name in names]
    return found


def graph() -> dict[str, set[str]]:
    trees = modules()
    return {name: {dep for dep, _ in own_imports(tree, set(trees)) if dep != name} for name, tree in trees.items()}


def layer_of(module: str) -> int:
    # longest matching prefix, down to a top-level module or package (never the bare root)
    for parts in range(module.count(".") + 1, 1 if module != "widenet_ds" else 0, -1):
        prefix = ".".join(module.split(".")[:parts])
        for index, layer in enumerate(LAYERS):
            if prefix in layer:
                return index
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS in {__file__}")


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Depth-first search; each back edge closes one cycle, returned as its path."""
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_package_imports_a_package_above_it():
    upward = [f"{module} -> {dep}" for module, deps in graph().items() for dep in deps
              if package_of(dep) != package_of(module) and layer_of(dep) > layer_of(module)]
    assert not upward, "upward imports: " + ", ".join(sorted(upward))


def test_no_function_local_imports_of_our_modules():
    trees = modules()
    local = [f"{name} imports {dep} inside a function" for name, tree in trees.items()
             for dep, top in own_imports(tree, set(trees)) if not top]
    assert not local, "; ".join(local)
