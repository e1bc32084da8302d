"""A suite job whose code under test rebinds the machinery that runs or records tests passes no test, through the
real bubblewrap sandbox (online_rl.sandbox.suite): the code runs at import in the runner's process, so a
`TestCase.run` that only starts and stops each test must not read as every test passing."""

from __future__ import annotations

import pytest

from online_rl.sandbox import suite

pytestmark = pytest.mark.timeout(120)

CFG = suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30)
TESTS = """\
import unittest

from shapes import area


class TestArea(unittest.TestCase):
    def test_area(self):
        self.assertEqual(area(2, 3), 6)

    def test_square(self):
        self.assertEqual(area(4, 4), 16)


def test_plain():
    assert area(1, 5) == 5
"""
IDS = ["test_shapes.TestArea.test_area", "test_shapes.TestArea.test_square", "test_shapes.test_plain"]
WRONG = "def area(w, h):\n    return w + h\n"


def _run(code: str, tests: str = TESTS) -> suite.SuiteRun:
    (run,) = suite.run([suite.SuiteJob({"shapes.py": code, "test_shapes.py": tests}, "test_shapes", select=IDS)], CFG)
    return run


def test_honest_code_is_judged_as_it_is():
    right = _run("def area(w, h):\n    return w * h\n")
    assert right.error is None and right.stable("pass") == set(IDS)
    assert not _run(WRONG).stable("pass")


@pytest.mark.parametrize(
    "attack",
    [
        "unittest.TestCase.run = lambda s, r=None: (r.startTest(s), r.stopTest(s))",  # the reviewer's
        "unittest.TestCase.run = lambda s, r=None: (r.startTest(s), r.addSuccess(s), r.stopTest(s))",
        "unittest.TestCase.__call__ = lambda s, r=None: (r.startTest(s), r.addSuccess(s), r.stopTest(s))",
        "unittest.TestSuite.run = lambda s, r, debug=False: r",
        "unittest.case._Outcome.testPartExecutor = lambda *a, **k: __import__('contextlib').nullcontext()",
        "unittest.TestCase._callTestMethod = lambda s, m: None",
        "unittest.TestResult.addFailure = lambda *a: None",
        "unittest.TestCase.assertEqual = lambda *a, **k: None",  # docs/sandbox.md's example
    ],
)
def test_code_that_rebinds_the_test_machinery_passes_nothing(attack):
    run = _run("import unittest\n" + attack + "\n" + WRONG)
    assert not run.stable("pass"), run
    assert run.error and run.error.startswith("tampered:"), run


def test_a_test_that_rebinds_the_machinery_while_running_passes_nothing():
    tests = TESTS.replace(
        "    def test_area(self):\n",
        "    def test_area(self):\n        unittest.TestCase.run = lambda s, r=None: (r.startTest(s), r.stopTest(s))\n",
    )
    run = _run(WRONG, tests)
    assert not run.stable("pass") and run.error and run.error.startswith("tampered:"), run
