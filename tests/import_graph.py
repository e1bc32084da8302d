"""Our modules' imports, read statically (ast: nothing is imported), as the import tests see them: every
`import` and `from ... import` (at the top, under TYPE_CHECKING, inside a function), relative imports resolved,
and importlib.import_module / __import__ of a literal name.

    tests/unit/repo/test_import_layers.py   which package may import which
    tests/unit/repo/test_import_cycles.py   no module imports itself back, through any number of others
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # not infra.paths: the scan imports nothing of ours

# The repository's own packages, bottom layer first (tests/unit/repo/test_import_layers.py says who imports whom):
# what ships (PRODUCTION; loadtests ships too, but nothing of production imports it) and what only runs it.
PRODUCTION = (
    "contracts",
    "kernels",
    "infra",
    "admin_api",
    "weight_patch",
    "serving",
    "weight_sync",
    "online_rl",
    "flywheel",
)
SHIPPED = (*PRODUCTION, "loadtests")
ALL_PACKAGES = (*SHIPPED, "benchmarks", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module a file imports: `import a.b`, `from a import b` (as a.b: b may be a module), relative
    imports resolved, and importlib.import_module / __import__ of a literal name."""
    tree = ast.parse(source)
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return {m for m in found if m}


def python_files(tops: Iterable[str]) -> list[Path]:
    """The .py files under each of these top-level folders."""
    files = []
    for top in sorted(tops):
        root = REPO_ROOT.joinpath(*top.split("."))
        files += [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(set(files))


def our_tops() -> set[str]:
    """The repository's packages (a folder at its root with an __init__.py), and tests."""
    return {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")} | {"tests"}


def module_graph(imports: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """module -> the modules of `imports` it imports. A name is resolved to the longest of them it starts
    with: `from pkg import name` is pkg.name where that is a module, else pkg (a package is its __init__);
    anything else (the standard library, a third party) is left out, and so is a module's import of itself."""
    graph: dict[str, set[str]] = {}
    for module, names in imports.items():
        targets = set()
        for name in names:
            parts = name.split(".")
            while parts and ".".join(parts) not in imports:
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def our_graph() -> dict[str, set[str]]:
    """The import graph of every module of ours."""
    return module_graph({module_name(p): imports_of(p) for p in python_files(our_tops())})


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected component of more than one module (Tarjan's algorithm,
    without recursion), its members sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)
