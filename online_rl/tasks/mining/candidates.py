"""Functions and methods worth deleting, found with ast, and the source with each body deleted.

A candidate is a module-level function or a method of a module-level class whose body (everything after the
signature and docstring) is between min_lines and max_lines lines of code. Deleting it keeps the signature and the
docstring and puts `raise NotImplementedError` where the body was: the prefix (the file up to the body) is what the
model sees before its cursor, the suffix what follows, and the body is the reference. Nested functions belong to
the body around them. What is not a candidate is counted by reason: unparsable (the file), too_short, too_long,
trivial (a body that is only pass, `...`, a raise or a bare return).
"""

from __future__ import annotations

import ast
import io
from collections import Counter
from dataclasses import dataclass

MARKER = "raise NotImplementedError"


def source_lines(text: str) -> list[str]:
    """The lines of a source as ast numbers them, ends kept: broken at \\n, \\r\\n and \\r only (str.splitlines also
    breaks at a form feed, \\x1c-\\x1e, \\x85, \\u2028..., which Python source may hold: edits by ast's line numbers
    would land on the wrong lines)."""
    return io.StringIO(text, newline="").readlines()


def apply_edits(text: str, edits: list[tuple[int, int, str]]) -> str:
    """`text` with each (first line, last line, replacement) applied, lines numbered as ast numbers them (an empty
    replacement removes the lines); the edits do not overlap."""
    lines = source_lines(text)
    for start, end, new in sorted(edits, key=lambda e: -e[0]):
        lines[start - 1 : end] = [new] if new else []
    return "".join(lines)


@dataclass(frozen=True)
class Deletion:
    path: str  # the file, relative to its source's root
    qualname: str  # e.g. "wrap" or "TextWrapper._split"
    lineno: int  # the `def` line
    prefix: str  # the file up to the body: everything above, the signature, the docstring
    body: str  # the deleted lines (the reference)
    suffix: str  # the rest of the file
    indent: str  # the body's indentation

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def deleted_source(self) -> str:
        """The file the model is shown: the body replaced by the marker."""
        return self.prefix + self.indent + MARKER + "\n" + self.suffix

    @property
    def original(self) -> str:
        return self.prefix + self.body + self.suffix

    def with_body(self, body: str) -> str:
        """The file with `body` (a completion) where the reference was."""
        return self.prefix + body + ("" if body.endswith("\n") else "\n") + self.suffix


def _code_lines(text: str) -> int:
    return sum(1 for line in source_lines(text) if line.strip() and not line.strip().startswith("#"))


def _trivial(stmts: list[ast.stmt]) -> bool:
    if len(stmts) != 1:
        return False
    s = stmts[0]
    return (
        isinstance(s, (ast.Pass, ast.Raise))
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        or (isinstance(s, ast.Return) and (s.value is None or isinstance(s.value, (ast.Constant, ast.Name))))
    )


def _functions(tree: ast.Module):
    """(qualname, node) of module-level functions and of methods of module-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def find(text: str, path: str, min_lines: int = 3, max_lines: int = 60) -> tuple[list[Deletion], Counter[str]]:
    """The candidates of one file, and what was passed over, by reason."""
    skipped: Counter[str] = Counter()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        skipped["unparsable"] += 1
        return [], skipped
    lines = source_lines(text)
    found = []
    for qualname, fn in _functions(tree):
        stmts = list(fn.body)
        doc = None
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
            if isinstance(stmts[0].value.value, str):
                doc = stmts.pop(0)
        if not stmts or _trivial(stmts):
            skipped["trivial"] += 1
            continue
        first = stmts[0]
        first_line = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
        if first_line == fn.lineno or (doc is not None and first_line == doc.end_lineno):
            skipped["too_short"] += 1  # a body on the def's (or the docstring's) own line
            continue
        if doc is not None:
            start = (doc.end_lineno or doc.lineno) + 1
        else:
            start = first_line
            while start - 1 > fn.lineno and lines[start - 2].strip().startswith("#"):
                start -= 1  # comments that open the body are part of it
        end = fn.end_lineno or first_line
        body = "".join(lines[start - 1 : end])
        n = _code_lines(body)
        if n < min_lines:
            skipped["too_short"] += 1
            continue
        if n > max_lines:
            skipped["too_long"] += 1
            continue
        first_text = lines[first_line - 1]
        indent = first_text[: len(first_text) - len(first_text.lstrip())]
        found.append(
            Deletion(
                path=path,
                qualname=qualname,
                lineno=fn.lineno,
                prefix="".join(lines[: start - 1]),
                body=body if body.endswith("\n") else body + "\n",
                suffix="".join(lines[end:]),
                indent=indent,
            )
        )
    return found, skipped
