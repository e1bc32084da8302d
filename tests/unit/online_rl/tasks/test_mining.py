"""Mining's pure parts: which functions are candidates and what their deletion looks like, how the runs' outcomes
become a reason, how the draw spreads over test files, and what a stored task shows the model."""

from __future__ import annotations

import ast

from online_rl.sandbox.suite import SuiteRun
from online_rl.tasks.mining import candidates, store
from online_rl.tasks.mining.sources import Source, _test_helpers, ship
from online_rl.tasks.mining.verify import MiningConfig, _draw, _Plan, classify, confirm

CODE = '''\
"""A module."""
import os


def short(x):
    y = x
    return y


def stub(x):
    """Not written yet."""
    raise NotImplementedError


def area(w, h):
    """The area."""
    # a comment inside
    if w < 0:
        raise ValueError
    return w * h


class Box:
    def volume(self):
        # no docstring: the comment opens the body
        v = self.w
        v *= self.h
        return v * self.d

    def one(self): a = 1; return a


def outer():
    def inner():
        return 1
    a = inner()
    return a + 1
'''


def test_candidates_and_what_is_passed_over():
    found, skipped = candidates.find(CODE, "m.py")
    assert [d.qualname for d in found] == ["area", "Box.volume", "outer"]  # inner is part of outer's body
    assert skipped == {"too_short": 2, "trivial": 1}  # short (2 lines), one (on the def's line); stub
    area = found[0]
    assert area.prefix.endswith('def area(w, h):\n    """The area."""\n')
    assert area.body.startswith("    # a comment inside\n    if w < 0:") and area.body.endswith("return w * h\n")
    assert area.original == CODE
    deleted = area.deleted_source
    assert "w * h" not in deleted and '    """The area."""\n    raise NotImplementedError\n\n\nclass Box' in deleted
    ast.parse(deleted)
    volume = found[1]
    assert volume.indent == "        " and volume.body.startswith("        # no docstring")
    assert volume.with_body("        return 0") == volume.prefix + "        return 0\n" + volume.suffix
    assert candidates.find("def f(:\n", "bad.py") == ([], {"unparsable": 1})
    assert [d.qualname for d in candidates.find(CODE, "m.py", max_lines=3)[0]] == ["area", "Box.volume"]


def _run(outcomes, seconds=None, **kw) -> SuiteRun:
    return SuiteRun(list(outcomes), outcomes, seconds or dict.fromkeys(outcomes, 0.01), **kw)


def test_outcomes_become_reasons():
    base = _run({"a": ["pass"] * 3, "b": ["pass"] * 3, "f": ["pass", "fail", "pass"], "x": ["fail"] * 3})
    assert classify(base, _run({"a": ["fail"], "b": ["pass"], "f": ["pass"], "x": ["fail"]}), 5, 20)[:2] == (
        None,
        ["a"],
    )
    assert classify(base, _run({"a": ["pass"], "b": ["pass"], "f": ["fail"], "x": ["fail"]}), 5, 20)[0] == "flaky"
    assert classify(base, _run({"a": ["pass"], "b": ["pass"], "f": ["pass"], "x": ["fail"]}), 5, 20)[0] == (
        "passes_without_code"
    )
    assert classify(base, _run({}, error="import m: NameError"), 5, 20)[:2] == (None, ["a", "b"])
    assert classify(base, _run({}, timed_out=True), 5, 20)[0] == "slow"
    slow_base = _run({"a": ["pass"] * 3}, {"a": 9.0})
    assert classify(slow_base, _run({"a": ["fail"]}), 5, 20)[0] == "slow"
    assert classify(_run({}, error="import t: ImportError"), _run({}), 5, 20)[0] == "fails_with_code"
    assert classify(_run({"x": ["fail"] * 3}), _run({"x": ["fail"]}), 5, 20)[0] == "fails_with_code"
    assert classify(base, _run({"a": ["error"], "b": ["fail"]}), 5, 1)[1] == ["a"]  # at most max_tests

    both = {"a": ["pass", "pass"], "b": ["pass", "pass"]}
    assert confirm(_run(both), _run({"a": ["fail", "error"], "b": ["fail", "fail"]}))[:2] == (None, ["a", "b"])
    assert confirm(_run(both), _run({"a": ["fail", "pass"], "b": ["pass", "pass"]}))[0] == "flaky"
    assert confirm(_run({"a": ["pass", "fail"]}), _run({"a": ["fail", "fail"]}))[0] == "flaky"
    assert confirm(_run({"a": ["fail", "fail"]}), _run({"a": ["fail", "fail"]}))[0] == "fails_with_code"


def test_the_draw_is_capped_and_spread_over_test_files():
    d = candidates.find(CODE, "m.py")[0][0]
    plans = [_Plan(d, f"t{i % 3}.py", ("", f"t{i % 3}.py")) for i in range(30)]
    drawn = _draw(plans, MiningConfig(max_candidates=7, max_per_test_file=2))
    assert len(drawn) == 6 and {p.test for p in drawn} == {"t0.py", "t1.py", "t2.py"}
    assert len(_draw(plans, MiningConfig(max_candidates=4, max_per_test_file=10))) == 4


def test_a_stored_task_shows_the_file_around_the_body_never_its_tests(tmp_path):
    d = candidates.find(CODE, "m.py")[0][0]
    task = store.MinedTask(
        task_id="x/m.py::area", source="x", version="1.0", origin="pypi:x==1.0", root=str(tmp_path), path="m.py",
        qualname="area", lineno=d.lineno, prefix=d.prefix, suffix=d.suffix, reference=d.body, indent=d.indent,
        test_path="tests/test_m.py", test_module="test_m", test_ids=("test_m.T.test_area",), paths=("", "tests"),
        fresh=("m",), ship_all=True, code_sha256=store.sha256(d.original), sandbox_s=0.5,
    )  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    assert store.save([task], path) == 1 and store.load([path]) == [task]
    shown = task.prompt + task.fim
    assert "test_m" not in shown and "w * h" not in shown and task.prompt.endswith('"""The area."""\n')
    assert task.code_with("    return 0") == d.with_body("    return 0")


def test_a_folder_is_code_and_tests_with_its_modules(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "pkg" / "core.py").write_text("def spin(x):\n    return x\n\ndef _hidden():\n    pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_core.py").write_text("from pkg.core import spin\nspin(spin(1))\n")
    (tmp_path / "tests" / "test_other.py").write_text("from pkg import core\n")
    (tmp_path / "setup.py").write_text("")
    src = Source.local(tmp_path)
    assert src.code == ["src/pkg/__init__.py", "src/pkg/core.py"] and src.tests == [
        "tests/test_core.py",
        "tests/test_other.py",
    ]
    assert src.paths == ["", "src"] and src.version.startswith("sha256:")
    assert src.module_of("src/pkg/core.py") == ("pkg.core", "src") and src.module_of("src/pkg/__init__.py") == (
        "pkg",
        "src",
    )
    assert src.module_of("tests/test_core.py") == ("test_core", "tests")
    texts = {t: src.read(t) for t in src.tests}
    assert src.tests_for("src/pkg/core.py", "spin", texts) == ["tests/test_core.py"]
    assert src.tests_for("src/pkg/core.py", "_hidden", texts) == ["tests/test_other.py"]  # private: its module's
    assert src.tests_for("src/pkg/core.py", "absent", texts) == []
    assert set(src.shipped("src/pkg/core.py", "tests/test_core.py")) == {
        "setup.py", "src/pkg/__init__.py", "src/pkg/core.py", "tests/test_core.py", "tests/test_other.py"
    }  # fmt: skip


def test_a_stdlib_pair_travels_with_the_helpers_its_test_imports(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "__init__.py").write_text("__path__.append('/usr/lib/python3.11/test')\n")
    (tmp_path / "test" / "audiotests.py").write_text("")
    (tmp_path / "wave.py").write_text("def f():\n    pass\n")
    (tmp_path / "test_wave.py").write_text("from test import audiotests, support\nfrom test.support import os_helper\n")
    (tmp_path / "test_plain.py").write_text("import unittest\n")
    text = "from test import support, audiotests\nfrom test.mock_socket import x\nimport test.pydoc_mod\n"
    assert _test_helpers(text) == ["audiotests", "mock_socket", "pydoc_mod"]
    assert set(ship(tmp_path, "wave.py", "test_wave.py", False)) == {
        "wave.py", "test_wave.py", "test/audiotests.py", "test/__init__.py"
    }  # fmt: skip
    assert set(ship(tmp_path, "wave.py", "test_plain.py", False)) == {"wave.py", "test_plain.py"}
