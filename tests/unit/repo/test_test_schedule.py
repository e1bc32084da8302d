"""The order make test's workers get test files in (tests/schedule.py), and its record."""

from __future__ import annotations

import json
from types import SimpleNamespace

from infra.paths import REPO_ROOT
from tests import schedule


def test_the_longest_unit_goes_first_and_an_unknown_file_counts_as_short():
    units = {
        "tests/unit/a/test_many.py": [f"tests/unit/a/test_many.py::t{i}" for i in range(50)],
        "group": ["tests/integration/x/test_fleet.py::t", "tests/integration/y/test_other.py::t"],
        "tests/integration/z/test_chaos.py": ["tests/integration/z/test_chaos.py::t1"],
        "tests/unit/b/test_new.py": ["tests/unit/b/test_new.py::t"],
    }
    seconds = {
        "tests/unit/a/test_many.py": 3.0,
        "tests/integration/x/test_fleet.py": 100.0,
        "tests/integration/y/test_other.py": 50.0,
        "tests/integration/z/test_chaos.py": 120.0,
    }
    assert schedule.longest_first(units, seconds) == [
        "group",  # a unit of several files counts them all: 150 s
        "tests/integration/z/test_chaos.py",
        "tests/unit/a/test_many.py",  # 50 tests but 3 s: xdist's own order would have put it first
        "tests/unit/b/test_new.py",  # not in the record: schedule.UNKNOWN_S
    ]


def test_the_recorder_sums_each_files_phases_and_keeps_files_it_did_not_run(tmp_path):
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({"tests/unit/old/test_kept.py": 7.0, "tests/unit/a/test_x.py": 99.0}))
    rec = schedule.DurationRecorder(record)
    for nodeid, seconds in [("tests/unit/a/test_x.py::t1", 1.0), ("tests/unit/a/test_x.py::t2", 2.25)] * 2:
        rec.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    rec.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace(workerinput={})))  # a worker: writes nothing
    assert json.loads(record.read_text())["tests/unit/a/test_x.py"] == 99.0
    rec.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace()))
    assert json.loads(record.read_text()) == {"tests/unit/a/test_x.py": 6.5, "tests/unit/old/test_kept.py": 7.0}


def test_the_record_names_only_test_files_that_exist():
    gone = [f for f in schedule.load() if not (REPO_ROOT / f).is_file()]
    assert not gone, f"tests/durations.json names files that are gone (delete them, or --record-durations): {gone}"
