"""The mined-task harness reads its jail's channel strictly (online_rl.sandbox.suite._parse), and training on mined
tasks, whose rewards a candidate can forge, is refused unless asked for by name."""

import json

import pytest

from online_rl.config import RolloutConfig
from online_rl.sandbox.suite import _parse


def _lines(*msgs) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in msgs)


def test_the_runners_own_lines_give_the_outcomes():
    run = _parse(_lines({"tests": ["t.a", "t.b"]}, {"repeat": 0, "outcomes": {"t.a": ["pass", 0.1]}}), None, 1.0)
    assert run.error is None and run.outcomes == {"t.a": ["pass"], "t.b": ["error"]}


@pytest.mark.parametrize(
    "out",
    [
        _lines({"tests": ["t.a"]}, {"outcomes": {"t.a": ["fail", 0.1]}}) + b"PASS t.a\n",  # a line of its own
        _lines({"tests": ["t.a"]}, {"tests": ["t.a"]}, {"outcomes": {"t.a": ["pass", 0.1]}}),  # a second list
        _lines({"outcomes": {"t.a": ["pass", 0.1]}}),  # outcomes before any list of tests
        _lines({"tests": ["t.a"]}, ["pass"]),  # not a message
    ],
)
def test_anything_else_on_the_channel_passes_no_test(out):
    run = _parse(out, None, 1.0)
    assert run.error.startswith("bad_output") and not run.stable("pass")


def test_a_last_line_cut_by_the_wall_clock_is_left_out():
    out = _lines({"tests": ["t.a"]}, {"outcomes": {"t.a": ["pass", 0.1]}}) + b'{"outcomes": {"t.a": ["pa'
    run = _parse(out, "wall_time", 5.0)
    assert run.error is None and run.timed_out and run.outcomes == {"t.a": ["pass"]}
    assert _parse(out, None, 5.0).error.startswith("bad_output")  # not killed: nothing excuses it


def test_training_on_mined_tasks_is_asked_for_by_name(tmp_path):
    with pytest.raises(ValueError, match="mined-rewards-forgeable-ok"):
        RolloutConfig(mined_tasks=tmp_path, mined_share=0.2)
    assert RolloutConfig(mined_tasks=tmp_path, mined_share=0.2, mined_rewards_forgeable_ok=True).mined_share == 0.2
