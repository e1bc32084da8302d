"""Every third-party package the code imports is declared in pyproject.toml: production code's in
[project.dependencies], and what only tests, load tests and benchmarks import at least in the `dev` extra.
Imports are read with ast (function-level ones included); each module is mapped to the distribution that
installs it, in the environment the tests run in."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.import_graph import PRODUCTION

REPO_ROOT = Path(__file__).resolve().parents[3]
OURS = {*PRODUCTION, "loadtests", "benchmarks", "tests", "docs"}
ELSEWHERE = ["loadtests", "benchmarks", "tests", "docs"]
# Imported by name but not a distribution of its own: the stub serving/replica/cpu_compat puts on SGLang's path.
NOT_DISTRIBUTIONS = {"vllm"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.match(r"[A-Za-z0-9_.-]+", req).group(0))


def declared() -> tuple[set[str], set[str]]:
    """(runtime dependencies, the dev extra), as normalised distribution names"""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return (
        {_requirement_name(r) for r in project["dependencies"]},
        {_requirement_name(r) for r in project["optional-dependencies"]["dev"]},
    )


def third_party_imports(packages: list[str]) -> dict[str, set[str]]:
    """top-level module -> the files that import it"""
    found: dict[str, set[str]] = {}
    for pkg in packages:
        for path in (REPO_ROOT / pkg).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for n in names:
                    top = n.split(".")[0]
                    if top not in OURS and top not in sys.stdlib_module_names and top not in NOT_DISTRIBUTIONS:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def _undeclared(modules: dict[str, set[str]], allowed: set[str]) -> list[str]:
    dists = packages_distributions()
    bad = []
    for module, files in sorted(modules.items()):
        names = {_norm(d) for d in dists.get(module, [])}
        if not names:
            bad.append(f"{module}: not installed (imported by {sorted(files)[:3]})")
        elif not names & allowed:
            bad.append(f"{module} (distribution {sorted(names)}) is not declared (imported by {sorted(files)[:3]})")
    return bad


def test_production_imports_are_runtime_dependencies():
    runtime, _ = declared()
    bad = _undeclared(third_party_imports(PRODUCTION), runtime)
    assert not bad, "\n".join(bad)


def test_test_and_load_test_imports_are_declared():
    runtime, dev = declared()
    bad = _undeclared(third_party_imports(ELSEWHERE), runtime | dev)
    assert not bad, "\n".join(bad)


def test_test_tools_are_not_runtime_dependencies():
    runtime, dev = declared()
    assert not {"pytest", "pytest-timeout", "hypothesis", "locust", "ruff"} & runtime
    assert {"pytest", "pytest-timeout", "hypothesis", "locust", "ruff"} <= dev
