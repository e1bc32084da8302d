"""Which package may import which: read statically from every file's `import` statements (ast, nothing is
imported: tests/import_graph.py), function-level imports included, so that no cycle between packages can come back
(and none between modules: tests/unit/repo/test_import_cycles.py).

The layers, bottom to top (a package may import only the ones below it, and itself):

    contracts, kernels        import nothing of ours: the contracts are what crosses processes as bytes (events,
                              control records, the tool-call text format, a replica's credentials), kernels are
                              numerics
    infra                     the local infrastructure every process shares: paths, processes, files,
                              configuration, progress bars, Maven, and Kafka administration, logins and dead
                              letters (which know the topics of the contracts)
    admin_api, weight_patch   the two protocols with both ends in one package: the gateway's admin API
                              (routes, capabilities, tokens, the client) and the in-place weight patch (writer
                              and the SGLang loader)
    weight_sync, serving      everything below; neither imports the other
    online_rl                 may import serving and weight_sync (it launches replicas, publishes weights)
    flywheel (top layer)      the command line, the demo and its simulated population, chaos, the local
                              fleet, the development broker launcher, test hosts, observability
    loadtests                 the locust users and scenarios, run against a local fleet or a deployed one

Production code is every package but loadtests (and tests and benchmarks, which may import anything):
none of it imports loadtests, tests or benchmarks. The command line imports no package by name either: each
package registers its subcommands through pyproject.toml's `flywheel.commands` entry points, loadtests (above
it) as any other, so no import here points up and the rules have no exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import PRODUCTION, REPO_ROOT, SHIPPED, imports_in, imports_of, module_name, python_files

_BOTTOM = {"contracts", "kernels", "infra"}
_PROTOCOLS = {"admin_api", "weight_patch"}
# layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "kernels": set(),
    "infra": {"contracts"},
    "admin_api": {"contracts", "infra"},
    "weight_patch": {"contracts", "infra", "kernels"},
    "weight_sync": _BOTTOM | _PROTOCOLS,
    "serving": _BOTTOM | _PROTOCOLS,
    "online_rl": _BOTTOM | _PROTOCOLS | {"weight_sync", "serving"},
    "flywheel": _BOTTOM | _PROTOCOLS | {"weight_sync", "serving", "online_rl"},
    "loadtests": _BOTTOM | _PROTOCOLS | {"weight_sync", "serving", "online_rl", "flywheel"},
}
FREE = {"tests", "benchmarks"}  # may import anything; nothing above may import them


def layer_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in ALLOWED or top in FREE else None  # None: the standard library or a third party


def source_files() -> list[Path]:
    return python_files(set(ALLOWED) | FREE)


def edges() -> list[tuple[str, str, str, str]]:
    """(file, its layer, imported module, that module's layer) for every import of ours across layers."""
    out = []
    for path in source_files():
        name = module_name(path)
        src = layer_of(name)
        targets = imports_of(path)
        for target in sorted(targets):
            dst = layer_of(target)
            if dst is not None and dst != src:
                out.append((str(path.relative_to(REPO_ROOT)), src, target, dst))
    return out


def test_every_package_of_the_repository_has_a_layer():
    packages = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert packages <= set(ALLOWED) | FREE, (
        f"a new package needs its place in ALLOWED: {packages - set(ALLOWED) - FREE}"
    )


def test_the_package_lists_agree_with_the_layers():
    """tests.import_graph's package lists (the size, flag and dependency checks read them) are these layers."""
    assert set(SHIPPED) == set(ALLOWED) and set(PRODUCTION) == set(ALLOWED) - {"loadtests"}


def test_the_layers_form_no_cycle():
    done: set[str] = set()
    left = dict(ALLOWED)
    while left:
        ready = [k for k, deps in left.items() if deps <= done]
        assert ready, f"ALLOWED has a cycle among {sorted(left)}"
        for k in ready:
            done.add(k)
            del left[k]


def test_imports_follow_the_layers():
    bad = [
        f"{f} ({src}) imports {target} ({dst})"
        for f, src, target, dst in edges()
        if src in ALLOWED and dst not in ALLOWED[src]
    ]
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_named_rules():
    """The rules of issue #16, one by one (ALLOWED implies them; these say them in words)."""
    seen = {(src, dst) for _, src, _, dst in edges()}
    assert ("serving", "online_rl") not in seen
    assert ("weight_sync", "online_rl") not in seen
    for bottom in ("contracts", "kernels"):
        assert not {dst for src, dst in seen if src == bottom}, f"{bottom} import nothing of ours"
    assert {dst for src, dst in seen if src == "infra"} <= {"contracts"}, "infra imports only the contracts"
    for src in PRODUCTION:
        assert (src, "loadtests") not in seen, f"{src} imports loadtests"
        assert not {dst for s, dst in seen if s == src} & FREE, f"{src} imports tests or benchmarks"


def test_package_inits_are_maps():
    """A package's __init__ is its map (a docstring) and imports nothing of ours: importing one module of a
    package runs no other."""
    inits = [p for p in source_files() if p.name == "__init__.py" and layer_of(module_name(p)) in ALLOWED]
    assert len(inits) > 20
    bad = {str(p.relative_to(REPO_ROOT)): sorted(m for m in imports_of(p) if layer_of(m)) for p in inits}
    assert not {k: v for k, v in bad.items() if v}


def test_every_module_is_on_its_package_map():
    """Each module and subpackage is named (`name` or `name/`) in its package's __init__ docstring: the map of a
    package is true, so a reader starts there."""
    unnamed = []
    for init in source_files():
        if init.name != "__init__.py" or layer_of(module_name(init)) not in ALLOWED or "stubs" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        here = init.parent
        parts = [p.stem for p in here.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        parts += [p.name for p in here.iterdir() if (p / "__init__.py").exists()]
        dotted = module_name(init)
        unnamed += [
            f"{dotted}.{m}" for m in sorted(parts) if not any(x in doc for x in (f"`{m}`", f"`{m}/`", f"{dotted}.{m}"))
        ]
    assert not unnamed, "name these in their package's __init__ docstring: " + ", ".join(unnamed)


def test_commands_are_registered_by_entry_points_that_are_installed():
    """Each package's subcommands come from pyproject.toml's flywheel.commands entry points, each naming a module
    of ours with `register`; the installed metadata says the same (a stale install would hide a command)."""
    import importlib
    import tomllib
    from importlib.metadata import entry_points

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["flywheel.commands"]
    assert {"loadtests.cli", "online_rl.cli", "serving.cli", "weight_sync.cli"} <= set(declared.values())
    for module in declared.values():
        assert layer_of(module) in ALLOWED and callable(importlib.import_module(module).register), module
    installed = {ep.name: ep.value for ep in entry_points(group="flywheel.commands")}
    assert installed == declared, "pyproject.toml's commands differ from the installed ones: run `make setup`"


def test_the_scanner_sees_every_kind_of_import():
    """The rules are only as good as the scan: function-level, relative and importlib imports count."""
    source = (
        "import importlib\n\n\ndef f():\n    from online_rl import trainer\n    import weight_sync.agent.loop\n"
        "    from . import gateway\n    from .cpu_compat import launch\n"
        "    importlib.import_module('loadtests.cli')\n"
    )
    found = imports_in(source, "serving.probe")
    assert {
        "online_rl.trainer",
        "weight_sync.agent.loop",
        "serving.gateway",
        "serving.cpu_compat.launch",
        "loadtests.cli",
    } <= found
    assert "contracts.events" in imports_in("from ..contracts import events\n", "serving.probe")
    assert "contracts.events" in imports_in("from . import events\n", "contracts", is_package=True)
