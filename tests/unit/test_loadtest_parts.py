"""Pieces of the load tests and the demo report that need no servers: preferences judged by code, the
duration flag, the per-version summary and the demo's verdict."""

import pytest

from flywheel import demo_report
from flywheel.population import HiddenTests, HouseStyle, Interaction
from loadtests.runner import parse_duration
from online_rl import tasks

TASK = next(t for t in tasks.tasks("heldout") if t.family == "add")


def test_house_style_is_judged_by_parsing_not_by_matching():
    prefers = HouseStyle()
    assert prefers(TASK, f"    return {TASK.arg} + 100\n")  # wrong, but house style: one return
    assert prefers(TASK, f"    return ({TASK.arg}\n            + 1)\n\ndef other():\n    pass\n")
    assert not prefers(TASK, f"    y = {TASK.arg}\n    return y\n")  # two statements
    assert not prefers(TASK, "    return (\n")  # does not parse
    assert not prefers(TASK, "    pass\n")


def test_hidden_tests_accept_correct_code_only():
    prefers = HiddenTests()
    correct = "    " + TASK.render_body(TASK.spec.body).strip() + "\n"
    assert prefers(TASK, correct)
    assert not prefers(TASK, "    " + TASK.render_body(TASK.spec.wrong[0]).strip() + "\n")


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("2m", 120), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_clear_error():
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration("soon")


def rec(version, outcome, started, latency=0.1):
    return Interaction("u", "t", started, latency, version, outcome)


def test_summary_per_version_and_verdict():
    class M:
        def __init__(self, raw, comp, kind):
            self.nbytes_raw, self.nbytes_compressed, self.kind = raw, comp, kind

    records = (
        [rec(0, "accept", 1.0 + i) for i in range(40)]
        + [rec(0, "reject", 50.0 + i) for i in range(60)]
        + [rec(0, "ignore", 99.0)]
        + [rec(1, "accept", 200.0 + i, 0.2) for i in range(70)]
        + [rec(1, "reject", 300.0 + i) for i in range(30)]
        + [rec(None, "failed", 250.0), rec(None, "failed", 0.5)]  # the second before any answer
        + [
            Interaction("a", "t", 260.0 + i, 2.0, 1, o, kind="agent", turns=4)
            for i, o in enumerate(("accept", "accept", "reject"))
        ]
    )
    switches = [
        {"version": 1, "pause_ms": 0.0, "drain_ms": 120.0, "load_ms": 300.0},
        {"version": 1, "pause_ms": 15.0, "load_ms": 280.0},
    ]
    rows = demo_report.summarize(
        records, switches, {0: M(4_000_000, 3_000_000, "full"), 1: M(4_000_000, 100_000, "delta")}
    )
    v0, v1 = rows
    assert (v0["version"], v0["acceptance"], v0["judged"], v0["requests"], v0["failed"]) == (0, 0.4, 100, 101, 1)
    assert (v1["acceptance"], v1["failed"], v1["switch_pause_ms"], v1["out_of_rotation_ms"]) == (0.7, 1, 15.0, 420.0)
    assert (v1["agent_acceptance"], v1["sessions"], v0["agent_acceptance"], v0["sessions"]) == (0.6667, 3, None, 0)
    assert v1["p99_ms"] < 1000  # the agent sessions' durations (2 s) are not request latencies
    assert v1["delta_ratio"] == 40.0 and v0["switch_pause_ms"] is None
    assert set(demo_report.FIELDS) <= set(v0)
    v = demo_report.verdict(rows)
    assert v["rise_points"] == 30.0 and v["failed_requests"] == 2 and not v["goal_met"]  # a failure spoils it
    assert "v1" in demo_report.table(rows)
