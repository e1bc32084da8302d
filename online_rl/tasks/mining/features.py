"""Whole features worth deleting: a function's definition together with the statements that call it, found with ast.

A feature is a candidate of online_rl.tasks.mining.candidates (a module-level function, or a method of a module-level
class, whose body is worth writing) that the repository's own non-test code calls. Deleting it removes:
- its definition (decorators included), a marker comment (`marker`) left in its place (and `pass` after it when the
  definition was its class's only statement);
- the smallest enclosing simple statement of each call site: `x = f(...)`, `f(...)`, `return f(...)`, `y += f(...)`,
  `assert f(...)`; a block the removals empty gets `pass`;
- the names that import it into another code module (`from pkg.mod import f`; the whole statement when it was its
  only name), so the modules still import.
Where calls are looked for: a module-level function's in its own module (`f(...)`) and in every code module that
imports it (`from M import f [as g]`: `g(...)`; `import M [as m]`, `from pkg import M`: `m.f(...)`; `from M import *`:
`f(...)`); a method's in its own module: `self.m(...)` and `cls.m(...)` inside its class, `C.m(...)` anywhere. Calls
inside the definition itself go with it. A source whose files do not all travel into the jail (the stdlib's pairs)
has its calls looked for in the function's own file only.

What is not a feature is counted by reason: no_call_sites (no code calls it; counted, not listed), used_as_value (it is
named other than as a call: a callback, a property read, a decorator), unremovable_call_site (a call in a compound
statement's header, `if f(x):`, `for y in f():`, a decorator's or a default's; one in a simple statement whose removal
would change more than the call's effect: raise, del, global, ...; a statement that shares its line; a file that would
no longer parse): each of those two with the call site that decided it.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from online_rl.tasks.mining.candidates import Deletion, _functions, apply_edits, find as find_bodies, source_lines

REMOVABLE = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Assert)
COMPOUND = (
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
    ast.AsyncWith, ast.Try, ast.Match,
)  # fmt: skip


def marker(qualname: str) -> str:
    """The comment left where the definition was."""
    return f"# TODO(restore): `{qualname}` was deleted from here, with the statements that called it"


@dataclass(frozen=True)
class Edit:
    path: str
    start: int  # first line replaced (1-based)
    end: int  # last line replaced
    text: str  # what replaces them ("": nothing)
    kind: str  # definition | call | import
    removed: str  # the lines as they were

    def provenance(self) -> dict:
        return {"path": self.path, "line": self.start, "kind": self.kind, "removed": self.removed, "text": self.text}


@dataclass(frozen=True)
class Feature:
    deletion: Deletion  # the function's body-mode deletion (the empty-body check restores it with `pass`)
    edits: tuple[Edit, ...]
    originals: dict[str, str] = field(hash=False)  # every file the deletion changes, as it was
    callers: tuple[str, ...]  # the functions (or modules) whose statements called it

    @property
    def path(self) -> str:
        return self.deletion.path

    @property
    def qualname(self) -> str:
        return self.deletion.qualname

    def files(self, definition: bool = True, calls: bool = True) -> dict[str, str]:
        """The changed files with the definition's edit and/or the call sites' (and imports') applied."""
        wanted = [e for e in self.edits if (definition if e.kind == "definition" else calls)]
        return {
            p: apply_edits(t, [(e.start, e.end, e.text) for e in wanted if e.path == p])
            for p, t in self.originals.items()
        }

    @property
    def shown(self) -> dict[str, str]:
        """What the model is shown: every edit applied."""
        return self.files()

    def empty_body(self) -> dict[str, str]:
        """The originals with the function's body replaced by `pass` (its calls in place)."""
        d = self.deletion
        return {**self.originals, d.path: d.prefix + d.indent + "pass\n" + d.suffix}


@dataclass
class _Module:
    path: str
    name: str  # dotted
    tree: ast.Module
    lines: list[str]
    parents: dict[ast.AST, ast.AST]
    functions: set[str]  # module-level function names
    classes: set[str]
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name) imported
    modules: dict[str, str] = field(default_factory=dict)  # local name -> the module it is bound to
    stars: list[str] = field(default_factory=list)  # modules imported with *


def _package(m: _Module) -> str:
    return m.name if m.path.endswith("__init__.py") else m.name.rpartition(".")[0]


def _absolute(m: _Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(m).split(".") if _package(m) else []
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def _load(path: str, name: str, text: str, known: set[str]) -> _Module | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    funcs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    m = _Module(path, name, tree, source_lines(text), parents, funcs, set())
    m.classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                m.modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(m, node)
            for a in node.names:
                if a.name == "*":
                    m.stars.append(mod)
                elif f"{mod}.{a.name}" in known:
                    m.modules[a.asname or a.name] = f"{mod}.{a.name}"
                else:
                    m.names[a.asname or a.name] = (mod, a.name)
    return m


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _class_of(m: _Module, node: ast.AST) -> str | None:
    """The module-level class whose method `node` is in, if any."""
    while node in m.parents:
        parent = m.parents[node]
        if isinstance(parent, ast.ClassDef) and isinstance(m.parents.get(parent), ast.Module):
            return parent.name
        node = parent
    return None


def _resolve(m: _Module, node: ast.expr, defs: dict[str, set[str]]) -> str | None:
    """`module:qualname` of the function an expression names, when it names one of the repository's."""
    if isinstance(node, ast.Name):
        if node.id in m.functions:
            return f"{m.name}:{node.id}"
        if node.id in m.names:
            return "%s:%s" % m.names[node.id]
        for star in m.stars:
            if node.id in defs.get(star, ()):
                return f"{star}:{node.id}"
        return None
    if not isinstance(node, ast.Attribute):
        return None
    chain = _dotted(node.value)
    if chain is None:
        return None
    if chain in ("self", "cls"):
        cls = _class_of(m, node)
        return f"{m.name}:{cls}.{node.attr}" if cls else None
    if chain in m.classes:
        return f"{m.name}:{chain}.{node.attr}"
    lead, _, rest = chain.partition(".")
    if lead in m.modules:
        return f"{m.modules[lead]}{'.' + rest if rest else ''}:{node.attr}"
    return None


def _uses(modules: list[_Module], defs: dict[str, set[str]]):
    """target -> [(module, node, is_call)]: every call of, and every other reference to, the repository's functions."""
    found: dict[str, list[tuple[_Module, ast.AST, bool]]] = {}
    for m in modules:
        funcs = set()
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and (target := _resolve(m, node.func, defs)):
                found.setdefault(target, []).append((m, node, True))
                funcs.add(node.func)
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) and node not in funcs:
                if target := _resolve(m, node, defs):
                    found.setdefault(target, []).append((m, node, False))
    return found


def _statement(m: _Module, node: ast.AST) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = m.parents[node]
    return node


def _inside(m: _Module, node: ast.AST, outer: ast.AST) -> bool:
    while node in m.parents:
        node = m.parents[node]
        if node is outer:
            return True
    return False


def _block(m: _Module, stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statement list `stmt` is in (None at module level: a module may be empty)."""
    parent = m.parents[stmt]
    if isinstance(parent, ast.Module):
        return None
    for _, value in ast.iter_fields(parent):
        if isinstance(value, list) and any(s is stmt for s in value):
            return value
    return None


def _alone_on_its_lines(m: _Module, stmt: ast.stmt) -> bool:
    first, last = m.lines[stmt.lineno - 1], m.lines[(stmt.end_lineno or stmt.lineno) - 1]
    rest = last.encode()[stmt.end_col_offset or 0 :].decode(errors="replace").strip()
    return not first[: stmt.col_offset].strip() and (not rest or rest.startswith("#"))


def _indent(m: _Module, stmt: ast.stmt) -> str:
    line = m.lines[stmt.lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _caller(m: _Module, node: ast.AST) -> str:
    """The function a statement is in (its innermost enclosing def), or the module's name at module level."""
    while node in m.parents:
        node = m.parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return m.name.rpartition(".")[2]


def _import_edit(m: _Module, node: ast.ImportFrom, gone: set[str]) -> str:
    kept = [a for a in node.names if a.name not in gone]
    if not kept:
        return ""
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
    return f"{_indent(m, node)}from {'.' * node.level}{node.module or ''} import {names}\n"


def find(
    texts: dict[str, str],
    modules: dict[str, str],
    code: list[str],
    min_lines: int = 3,
    max_lines: int = 60,
    same_file_only: bool = False,
) -> tuple[list[Feature], Counter[str], list[tuple[str, str, str]]]:
    """The features of `code` (files; `texts` holds every code file's text, `modules` its dotted name): the features,
    what was passed over by reason, and the (candidate, reason, detail) of each one rejected with a call site."""
    skipped: Counter[str] = Counter()
    loaded = {p: _load(p, modules[p], texts[p], set(modules.values())) for p in texts}
    parsed = [m for m in loaded.values() if m is not None]
    defs = {m.name: m.functions for m in parsed}
    everywhere = None if same_file_only else _uses(parsed, defs)
    features, rejected = [], []
    for path in code:
        bodies, passed_over = find_bodies(texts[path], path, min_lines, max_lines)
        skipped.update(passed_over)
        home = loaded[path]
        if home is None:
            continue
        uses = everywhere if everywhere is not None else _uses([home], defs)
        nodes = {(q, fn.lineno): fn for q, fn in _functions(home.tree)}
        for d in bodies:
            fn = nodes[(d.qualname, d.lineno)]
            cand = f"{path}::{d.qualname}"
            found = [(m, n, call) for m, n, call in uses.get(f"{home.name}:{d.qualname}", []) if not _inside(m, n, fn)]
            value = next(((m, n) for m, n, call in found if not call), None)
            if value is not None:
                m, n = value
                rejected.append((cand, "used_as_value", f"{m.path}:{n.lineno}: named other than in a call"))
                continue
            if not found:
                skipped["no_call_sites"] += 1
                continue
            feature = _feature(d, fn, home, found, loaded, same_file_only)
            if isinstance(feature, str):
                rejected.append((cand, "unremovable_call_site", feature))
            else:
                features.append(feature)
    return features, skipped, rejected


def _feature(d: Deletion, fn, home: _Module, calls, loaded, same_file_only: bool) -> Feature | str:
    """The feature's edits, or why one of its call sites cannot be removed."""
    removals: list[tuple[_Module, ast.stmt, str, str]] = []  # (module, statement, its replacement, kind)
    seen: set[ast.stmt] = set()
    callers = []
    for m, call, _ in calls:
        stmt = _statement(m, call)
        where = f"{m.path}:{call.lineno}"
        if isinstance(stmt, COMPOUND):
            return f"{where}: the call is in the header of a {type(stmt).__name__} statement"
        if not isinstance(stmt, REMOVABLE):
            return f"{where}: the call is in a {type(stmt).__name__} statement"
        if not _alone_on_its_lines(m, stmt):
            return f"{where}: its statement shares a line with another"
        if stmt not in seen:
            seen.add(stmt)
            removals.append((m, stmt, "", "call"))
            callers.append(_caller(m, stmt))
    if "." not in d.qualname and not same_file_only:
        for m in loaded.values():
            if m is None or m is home:
                continue
            for node in ast.walk(m.tree):
                if isinstance(node, ast.ImportFrom) and _absolute(m, node) == home.name:
                    gone = {a.name for a in node.names if a.name == d.qualname}
                    if gone and not _alone_on_its_lines(m, node):
                        return f"{m.path}:{node.lineno}: the import of it shares a line with another statement"
                    if gone:
                        removals.append((m, node, _import_edit(m, node, gone), "import"))
    start = min([fn.lineno] + [x.lineno for x in fn.decorator_list])
    indent = _indent(home, fn)
    definition = indent + marker(d.qualname) + "\n"
    if _block(home, fn) == [fn]:
        definition += indent + "pass\n"
    removals.append((home, fn, definition, "definition"))
    # A block every statement of which goes gets `pass` in its first removed statement's place.
    by_block: dict[int, list[tuple[_Module, ast.stmt, str, str]]] = {}
    for r in removals:
        block = _block(r[0], r[1])
        if block is not None and r[3] != "definition":
            by_block.setdefault(id(block), []).append(r)
    edits = []
    for m, stmt, text, kind in removals:
        block = _block(m, stmt)
        if kind != "definition" and block is not None and not text:
            emptied = by_block[id(block)]
            if len(emptied) == len(block) and min(emptied, key=lambda r: r[1].lineno)[1] is stmt:
                text = _indent(m, stmt) + "pass\n"
        s = start if kind == "definition" else stmt.lineno
        e = stmt.end_lineno or stmt.lineno
        edits.append(Edit(m.path, s, e, text, kind, "".join(m.lines[s - 1 : e])))
    for a in edits:
        if any(b is not a and b.path == a.path and b.start <= a.end and a.start <= b.end for b in edits):
            return f"{a.path}:{a.start}: two removals overlap"
    originals = {p: "".join(loaded[p].lines) for p in sorted({e.path for e in edits})}
    feature = Feature(d, tuple(sorted(edits, key=lambda e: (e.path, e.start))), originals, tuple(sorted(set(callers))))
    for variant in (feature.shown, feature.files(definition=False)):
        for p, text in variant.items():
            try:
                ast.parse(text)
            except SyntaxError as e:
                return f"{p}:{e.lineno}: the file does not parse after the deletion"
    return feature
