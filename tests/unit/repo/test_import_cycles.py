"""No import cycle between our modules (issue #49): a part takes what it uses, not its owner. Every import
counts, read statically by the scan the layer test uses (tests/import_graph.py): at the top, under
TYPE_CHECKING, inside a function, and importlib's; a cycle hidden behind any of them is a cycle all the same."""

from __future__ import annotations

from tests.import_graph import cycles, imports_in, module_graph, our_graph


def _explain(graph: dict[str, set[str]], cycle: list[str]) -> str:
    members = set(cycle)
    edges = [f"    {m} -> {t}" for m in cycle for t in sorted(graph[m] & members)]
    return f"{len(cycle)} modules: {', '.join(cycle)}\n" + "\n".join(edges)


def test_no_module_imports_itself_back():
    graph = our_graph()
    assert len(graph) > 300  # the whole repository was read
    found = cycles(graph)
    assert not found, "import cycles (break each: pass the parts, or move what both use to a module of its own):\n" + (
        "\n".join(_explain(graph, c) for c in found)
    )


def test_the_scan_sees_a_cycle_through_every_kind_of_import():
    """A cycle of four through a TYPE_CHECKING import, a function-level relative import, importlib, and a
    `from package import module`; a module that only imports into the cycle is not in it."""
    sources = {
        "pkg": ("", True),
        "pkg.a": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.b import B\n", False),
        "pkg.b": ("def f():\n    from . import c\n", False),
        "pkg.c": ("import importlib\n\nimportlib.import_module('pkg.sub.d')\n", False),
        "pkg.sub": ("", True),
        "pkg.sub.d": ("from pkg import a\nimport os\n", False),
        "pkg.e": ("from pkg.a import thing\n", False),
        "pkg.f": ("from pkg.sub import d\n", False),
    }
    graph = module_graph({m: imports_in(src, m, is_package) for m, (src, is_package) in sources.items()})
    assert graph["pkg.sub.d"] == {"pkg", "pkg.a"}  # a package counts as its __init__; os is not ours
    assert graph["pkg.f"] == {"pkg.sub", "pkg.sub.d"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]
    assert cycles({**graph, "pkg.b": set()}) == []  # one link less: no cycle


def test_two_cycles_are_told_apart():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}
    assert cycles(graph) == [["a", "b"], ["c", "d"]]
