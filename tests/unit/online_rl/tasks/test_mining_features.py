"""Feature mode's pure parts: which functions are features, what their deletion removes (the definition, each call's
statement, the imports of it; `pass` where a block empties), which are rejected with a reason, and how a stored
feature task reads an answer."""

from __future__ import annotations

import ast

from online_rl.tasks.mining import candidates, features, store

CORE = '''\
"""Core."""


def scale(x, k):
    """x times k, checked."""
    if k < 0:
        raise ValueError("k")
    y = x * k
    return y


def total(xs):
    s = 0
    for x in xs:
        s += scale(x, 2)
    return s


def check(v):
    if v:
        scale(
            v, 1
        )
    return v


class Box:
    def grow(self, n):
        """Grow."""
        a = n + 1
        b = a * 2
        return b

    def cond(self):
        if self.grow(1) > 2:
            return 1
        return 0


def hook(x):
    a = x
    b = a + 1
    return b


HOOKS = [hook]


def shared(x):
    a = x
    b = a + 2
    return b


def user(x):
    a = 1; shared(x)
    return a
'''

USER = """\
from pkg.core import scale, total
from . import core


def use(v):
    w = scale(v, 3)
    return core.scale(w, 1)


def only():
    scale(1, 1)
"""

TEXTS = {"pkg/__init__.py": "", "pkg/core.py": CORE, "pkg/user.py": USER}
MODULES = {"pkg/__init__.py": "pkg", "pkg/core.py": "pkg.core", "pkg/user.py": "pkg.user"}


def test_a_feature_goes_with_its_calls_and_imports():
    found, skipped, rejected = features.find(TEXTS, MODULES, ["pkg/core.py"])
    assert [f.qualname for f in found] == ["scale"]
    (f,) = found
    assert f.callers == ("check", "only", "total", "use")
    kinds = sorted((e.path, e.start, e.kind) for e in f.edits)
    assert kinds == [
        ("pkg/core.py", 4, "definition"), ("pkg/core.py", 15, "call"), ("pkg/core.py", 21, "call"),
        ("pkg/user.py", 1, "import"), ("pkg/user.py", 6, "call"), ("pkg/user.py", 7, "call"),
        ("pkg/user.py", 11, "call"),
    ]  # fmt: skip
    shown = f.shown
    core, user = shown["pkg/core.py"], shown["pkg/user.py"]
    assert "def scale" not in core and "# TODO(restore): `scale` was deleted from here" in core
    assert "    for x in xs:\n        pass\n    return s" in core  # an emptied block gets `pass`
    assert "    if v:\n        pass\n    return v" in core  # the whole multi-line statement goes
    assert user.startswith("from pkg.core import total\nfrom . import core\n")  # the import of it, only it
    assert "def use(v):\n    pass\n" in user and "def only():\n    pass\n" in user
    for text in shown.values():
        ast.parse(text)
    assert f.files(definition=False, calls=False) == f.originals == {p: TEXTS[p] for p in shown}
    kept = f.files(definition=False)
    assert "def scale(x, k):" in kept["pkg/core.py"] and "scale(" not in kept["pkg/user.py"]
    assert "    return None\n" not in f.empty_body()["pkg/core.py"] and "    pass\n" in f.empty_body()["pkg/core.py"]


def test_what_is_not_a_feature_says_why():
    found, skipped, rejected = features.find(TEXTS, MODULES, ["pkg/core.py"])
    why = {cand: (reason, detail) for cand, reason, detail in rejected}
    assert why["pkg/core.py::Box.grow"] == (
        "unremovable_call_site",
        "pkg/core.py:35: the call is in the header of a If statement",
    )
    assert why["pkg/core.py::hook"][0] == "used_as_value" and why["pkg/core.py::hook"][1].startswith("pkg/core.py:46")
    shared = ("unremovable_call_site", "pkg/core.py:56: its statement shares a line with another")
    assert why["pkg/core.py::shared"] == shared
    assert skipped["no_call_sites"] == 3  # total (imported, never called), Box.cond, user
    # The stdlib's pairs: only the function's own file is edited, so a call from elsewhere is not seen.
    alone, skipped, _ = features.find(TEXTS, MODULES, ["pkg/core.py"], same_file_only=True)
    assert {e.path for e in alone[0].edits} == {"pkg/core.py"}


def test_a_feature_task_reads_an_answer_and_rebuilds_its_variants(tmp_path):
    (f,) = features.find(TEXTS, MODULES, ["pkg/core.py"])[0]
    task = store.FeatureTask(
        task_id="x/pkg/core.py::scale", source="x", version="1", origin="local", root=str(tmp_path), path=f.path,
        qualname="scale", lineno=4, shown=f.shown, reference=dict(f.originals),
        call_sites=tuple(e.provenance() for e in f.edits), test_path="tests/test_core.py", test_module="test_core",
        test_ids=("test_core.T.test_total",), paths=("", "tests"), fresh=("pkg.core",), ship_all=True,
        code_sha256={p: store.sha256(t) for p, t in f.originals.items()}, sandbox_s=1.0,
    )  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    store.save([task], path)
    assert store.load([path]) == [task]
    assert task.files_of(task.answer) == task.reference
    assert task.files_without_calls() == f.files(definition=False)
    only_core = task.files_of("### pkg/core.py\n" + CORE + "### tests/test_core.py\nhacked\n")
    assert only_core == {"pkg/core.py": CORE, "pkg/user.py": task.shown["pkg/user.py"]}  # a test is never replaced
    assert task.files_of("no headers") == task.shown  # two files changed: an answer names each
    assert "test_core" not in task.prompt and task.prompt.startswith("The function `scale` was deleted")


def test_a_form_feed_line_does_not_move_the_edits():
    """str.splitlines breaks at a form feed too; ast's line numbers count only newlines: the edits land where ast says
    (before, the deletion removed the statement above the call instead of the call)."""
    core = "\x0c\n" + CORE.replace('"""Core."""\n', '"""Core."""\n\x0c\n', 1)
    (f,) = features.find({**TEXTS, "pkg/core.py": core}, MODULES, ["pkg/core.py"])[0]
    shown = f.shown["pkg/core.py"]
    assert "def scale" not in shown and "scale(" not in shown and "\x0c\n" in shown
    assert "    s = 0\n    for x in xs:\n        pass\n    return s" in shown  # the call went, the rest stayed
    assert f.files(definition=False, calls=False)["pkg/core.py"] == core
    kept = f.files(definition=False)["pkg/core.py"]
    assert "def scale(x, k):\n" in kept and "s += scale" not in kept and "    s = 0\n" in kept
    for text in f.shown.values():
        ast.parse(text)
    (body,), _ = candidates.find("\x0c\ndef area(w, h):\n    \x0c\n    a = w * h\n    b = a\n    return b\n", "g.py")
    assert body.body == "    a = w * h\n    b = a\n    return b\n" and body.lineno == 2
    assert body.prefix == "\x0c\ndef area(w, h):\n    \x0c\n" and body.suffix == ""


def test_files_without_a_last_newline_read_back_from_the_answer(tmp_path):
    """The `### PATH` format: a file that does not end with a newline gets one, so the next header starts a line."""
    (f,) = features.find(TEXTS, MODULES, ["pkg/core.py"])[0]
    reference = {"pkg/core.py": CORE.rstrip("\n"), "pkg/user.py": USER.rstrip("\n")}
    task = store.FeatureTask(
        task_id="x/pkg/core.py::scale", source="x", version="1", origin="local", root=str(tmp_path), path=f.path,
        qualname="scale", lineno=4, shown={p: t.rstrip("\n") for p, t in f.shown.items()}, reference=reference,
        call_sites=tuple(e.provenance() for e in f.edits), test_path="tests/test_core.py", test_module="test_core",
        test_ids=("test_core.T.test_total",), paths=("", "tests"), fresh=("pkg.core",), ship_all=True,
        code_sha256={p: store.sha256(t) for p, t in reference.items()}, sandbox_s=1.0,
    )  # fmt: skip
    assert "\n### pkg/user.py\n" in task.answer and "\n### pkg/user.py\n" in task.prompt
    assert task.files_of(task.answer) == {p: t + "\n" for p, t in reference.items()}
    assert store.FeatureTask.from_json(task.to_json()).files_of(task.answer)["pkg/user.py"] == USER
    assert store.as_sections({"a.py": "", "b.py": "x = 1"}) == "### a.py\n### b.py\nx = 1\n"
    assert task.files_of(store.as_sections({"pkg/core.py": ""}))["pkg/core.py"] == ""
