"""Mining a small repository made here, with known features, through the real bubblewrap sandbox.

The repository has a function whose tests pin it (mined, and its task judged both ways: the reference passes, the
deleted body and a wrong one fail), one whose only test passes without it, one whose only test passes with an empty
body (it checks only that nothing raises), one whose only test is flaky (it counts
its own runs in a file of the work dir and fails every other time), and one whose test file fails on the original code:
each rejected with its reason. The command (`flywheel tasks mine`, through its main) writes the tasks with their
provenance (the repository's commit) and the rejections with why.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from online_rl.tasks import synthetic
from online_rl.tasks.mining import cli, mixture, store
from online_rl.tasks.mining.judge import judge
from online_rl.tasks.mining.verify import recheck
from tests import mined_repo

pytestmark = pytest.mark.timeout(120)

GEOMETRY = '''\
"""Shapes."""


def area(w, h):
    """The area of a w by h rectangle; a negative side is an error."""
    if w < 0 or h < 0:
        raise ValueError("negative side")
    result = w * h
    return result


def describe(w, h):
    """A label for a rectangle."""
    kind = "square" if w == h else "rectangle"
    label = f"{kind} {w}x{h}"
    return label.strip()


def stamp(n):
    """The numbers below n."""
    out = []
    for i in range(n):
        out.append(i)
    return out


def log_event(name):
    """Print that `name` happened."""
    line = f"event {name}"
    line = line.strip()
    print(line)


def total(xs):
    """The sum of xs."""
    s = 0
    for x in xs:
        s += x
    return s
'''

TESTS = """\
import os
import unittest

from shapes.geometry import area, describe, log_event, stamp


class AreaTest(unittest.TestCase):
    def test_area(self):
        self.assertEqual(area(2, 3), 6)

    def test_negative(self):
        with self.assertRaises(ValueError):
            area(-1, 2)


def test_describe_exists():
    assert callable(describe)  # names it, never checks what it returns


def test_log_event():
    log_event("x")  # only checks that it does not raise: an empty body passes it


def test_stamp_counted():
    runs = int(open("runs").read()) if os.path.exists("runs") else 0
    with open("runs", "w") as f:
        f.write(str(runs + 1))
    assert stamp(2) == [0, 1]
    assert runs % 2 == 0  # fails every other run in the same process: flaky
"""

TOTAL_TESTS = """\
from shapes.geometry import total


def test_total_wrong():
    assert total([1, 2]) == 4  # wrong on the original code
"""


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    files = {"shapes/__init__.py": "", "shapes/geometry.py": GEOMETRY}
    files |= {"tests/test_geometry.py": TESTS, "tests/test_total.py": TOTAL_TESTS}
    repo = mined_repo.write_repo(tmp_path_factory.mktemp("repo"), files)
    commit = mined_repo.commit(repo, "shapes")
    out = repo.parent / "out"
    assert cli.main(["tasks", "mine", str(repo), "--out", str(out), "--no-progress"]) == 0
    folder = out / repo.name
    summary = json.loads((folder / "summary.json").read_text())
    rejected = {json.loads(line)["candidate"]: json.loads(line) for line in open(folder / "rejected.jsonl")}
    return store.load([folder / "tasks.jsonl"]), rejected, summary, commit


def test_the_feature_is_mined_with_its_tests_and_provenance(mined):
    tasks, _, summary, commit = mined
    (task,) = tasks
    assert task.qualname == "area" and task.path == "shapes/geometry.py"
    assert task.version == commit and task.source.startswith("repo")
    assert set(task.test_ids) == {"test_geometry.AreaTest.test_area", "test_geometry.AreaTest.test_negative"}
    assert task.test_path == "tests/test_geometry.py"
    # The model sees the signature and docstring, not the body, not the tests.
    assert task.prompt.endswith('    """The area of a w by h rectangle; a negative side is an error."""\n')
    assert "w * h" not in task.prompt + task.suffix
    assert "test_" not in task.prompt + task.suffix and "assert" not in task.prompt + task.suffix
    assert summary["candidates"] == 5 and summary["valid"] == 1 and summary["sandbox_s_per_task"] > 0


def test_each_rejection_says_why(mined):
    _, rejected, summary, _ = mined
    assert rejected["shapes/geometry.py::describe"]["reason"] == "passes_without_code"
    assert rejected["shapes/geometry.py::stamp"]["reason"] == "flaky"
    assert "test_stamp_counted" in rejected["shapes/geometry.py::stamp"]["detail"]
    assert rejected["shapes/geometry.py::total"]["reason"] == "fails_with_code"
    assert rejected["shapes/geometry.py::log_event"]["reason"] == "passes_without_code"
    assert "empty body" in rejected["shapes/geometry.py::log_event"]["detail"]
    assert summary["rejected"] == {"passes_without_code": 2, "flaky": 1, "fails_with_code": 1}


def test_the_task_is_judged_both_ways_in_the_sandbox(mined):
    (task,), _, _, _ = mined
    right = "    if min(w, h) < 0:\n        raise ValueError('no')\n    return h * w\n"
    wrong = "    if w < 0 or h < 0:\n        raise ValueError('x')\n    return w + h\n"
    deleted = task.indent + "raise NotImplementedError\n"
    reference, other, bad, empty = judge([(task, None), (task, right), (task, wrong), (task, deleted)])
    assert reference.ok and other.ok, (reference, other)
    assert bad.passed == 1 and not bad.ok  # the negative-side test alone still passes
    assert empty.reward == 0.0
    kept, rejected, seconds = recheck([task])  # stored tasks verified again: this one holds
    assert [t.test_ids for t in kept] == [task.test_ids] and not rejected and seconds > 0
    assert textwrap.dedent(task.reference).startswith("if w < 0 or h < 0:")


def test_mined_tasks_join_the_rollout_mixture(mined, tmp_path):
    (task,), _, _, _ = mined
    tasks_file = tmp_path / "m" / "tasks.jsonl"
    store.save([task], tasks_file)
    held = synthetic.tasks("heldout")
    drawn = mixture.Mixture(held, tmp_path, share=1.0).draw(3)
    assert [t for t in drawn if isinstance(t, store.MinedTask)] == [task] and len(drawn) == 3  # never twice a step
    none = mixture.Mixture(held, tmp_path, share=0.0)
    assert not none.mined and all(isinstance(t, synthetic.Task) for t in none.draw(8))
    half = [t for _ in range(50) for t in mixture.Mixture(held, tasks_file, share=0.5, seed=_).draw(2)]
    assert 10 < sum(isinstance(t, store.MinedTask) for t in half) < 90
    with pytest.raises(FileNotFoundError):
        mixture.Mixture(held, tmp_path / "nothing", share=0.1)
    # A rollout's prompt ends with the signature and docstring; its completions are judged by the hidden tests.
    assert (
        mixture.prompt_of(task, 60)
        == 'def area(w, h):\n    """The area of a w by h rectangle; a negative side is an error."""\n'
    )
    assert mixture.prompt_of(task, 10_000) == task.prefix and mixture.prompt_of(held[0]) == held[0].prompt
    assert mixture.prompt_of(task, 95).startswith("\n\ndef area")  # whole lines above, as many as fit
    verdicts = mixture.judge(task, [task.reference, "    return 0\n"])
    assert [v.reward for v in verdicts] == [1.0, 0.0]
    assert [v.ok for v in mixture.judge(held[0], [held[0].reference, "    return None\n"])] == [True, False]
