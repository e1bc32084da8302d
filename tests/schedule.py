"""The order in which `make test`'s workers are handed test files: longest first, by each file's seconds in an
earlier run (tests/durations.json), so the two workers finish together.

pytest-xdist's `loadfile` hands out files in order of their number of tests, which put the long fleet tests (two
tests each, minutes) last: in a run at 8578996 one worker sat idle for the last 1.6 of 27 minutes while the other
ran the chaos test. Handing out the longest unit first (the classic LPT rule) leaves the short unit tests to fill
in at the end. A file missing from the record (a new one) counts as `UNKNOWN_S`: most new files are unit tests.

`python -m pytest ... --record-durations` rewrites the record from the run (the files it ran; others kept).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).with_name("durations.json")
UNKNOWN_S = 2.0


def load(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """File -> seconds (setup, call and teardown of its tests together); empty if there is no record."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def unit_seconds(nodeids: Iterable[str], durations: Mapping[str, float]) -> float:
    """The expected seconds of a unit of work: the recorded seconds of every file its tests are in."""
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    return sum(durations.get(f, UNKNOWN_S) for f in files)


def longest_first(units: Mapping[str, Iterable[str]], durations: Mapping[str, float]) -> list[str]:
    """The units' names (scope -> its node ids), longest expected first; ties keep their given order."""
    seconds = {scope: unit_seconds(nodeids, durations) for scope, nodeids in units.items()}
    return sorted(units, key=lambda scope: -seconds[scope])


class DurationRecorder:
    """Sums each test file's setup, call and teardown seconds over a run and writes them into the record at the
    end (on the xdist controller, or the only process; workers' reports reach the controller)."""

    def __init__(self, path: Path = DURATIONS_FILE):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return
        merged = {**load(self.path), **{f: round(s, 1) for f, s in self.seconds.items()}}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
