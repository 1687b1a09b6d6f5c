"""The house as docs/architecture.md draws it, held to the code: each module imports only from its
own floor or below, no import circle, and nothing of the product imports the lab."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The floors, lowest first: what a module may import is on its floor or below. The node programs
# (files/dual_spark) import only themselves; the lab sits beside the product, never under it.
FLOORS = {
    "layout": 1, "site_schema": 1, "cluster": 1, "states": 1, "files": 1, "dual_spark": 1,
    "programs": 2, "facts": 2,
    "checks": 3, "serving_data": 3,
    "site_config": 4, "operations": 4,
    "tasks": 5, "bench": 5, "inventory": 5, "config": 5, "deploy": 5, "group_data": 5,
    "clients": 6,
}
# bench/deploy_bench.py times a converge of the lab itself, for the developers: the lab's, not the product's.
LAB_TOOLS = {"bench.deploy_bench"}
PRODUCT = [path for path in REPO.rglob("*.py") if path.relative_to(REPO).parts[0] in FLOORS | {"files": 1}
           or path.parent == REPO]


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The project's modules ``path`` imports, by their full dotted names (relative imports resolved)."""
    found = set()
    package = module_of(path).split(".")[:-1] if path.name != "__init__.py" else module_of(path).split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, node.module] if node.module else base)
            found |= {name} | {f"{name}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in FLOORS or name.split(".")[0] == "lab"}


def floor(module: str) -> int:
    return FLOORS[module.split(".")[0]]


def test_every_import_goes_to_the_same_floor_or_below():
    upward = [f"{module_of(path)} (floor {floor(module_of(path))}) imports {name} (floor {floor(name)})"
              for path in PRODUCT if path.parent != REPO or path.stem in FLOORS
              for name in imports(path) if not name.startswith("lab") and floor(name) > floor(module_of(path))]
    assert upward == []


def test_checks_and_facts_never_import_operations():
    reads = [path for path in PRODUCT if module_of(path).split(".")[0] in ("checks", "facts")]
    assert reads and [(module_of(p), n) for p in reads for n in imports(p) if n.split(".")[0] in ("operations", "tasks")] == []


def test_nothing_of_the_product_imports_the_lab():
    assert [(module_of(path), name) for path in PRODUCT for name in imports(path)
            if name.split(".")[0] == "lab" and module_of(path) not in LAB_TOOLS] == []


def test_no_import_circle():
    """Between the product's files: a module reached again from itself is a circle."""
    files = {module_of(path): path for path in PRODUCT}
    edges = {module: {name if name in files else name.rsplit(".", 1)[0] for name in imports(path)} & files.keys() - {module}
             for module, path in files.items()}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> list[str] | None:
        state[module] = "open"
        for other in sorted(edges[module]):
            if state.get(other) == "open":
                return trail + [module, other]
            if other not in state and (circle := visit(other, trail + [module])):
                return circle
        state[module] = "done"
        return None

    circles = [circle for module in sorted(files) if module not in state and (circle := visit(module, []))]
    assert circles == []
