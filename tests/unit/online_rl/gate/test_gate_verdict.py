"""The eval gate's statistics (online_rl.gate.verdict): a metric regresses only when it is worse beyond its margin
with confidence; equal outcomes pass, noise within the margin passes, a clear drop blocks; answer length blocks
either way; empty arms, a bad confidence and an empty suite are errors that say so."""

from __future__ import annotations

import random

import pytest

from online_rl.gate.suite import SuiteConfig, empty_or_refusal
from online_rl.gate.verdict import Metric, compare, judge

PASS = Metric("pass_at_1", "proportion", "higher", 0.05)
EMPTY = Metric("empty_or_refusal", "proportion", "lower", 0.02)
LENGTH = Metric("answer_tokens", "mean", "near", 0.5)


def _rate(p: float, n: int, seed: int) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < p for _ in range(n)]


def test_identical_outcomes_pass_with_a_zero_difference():
    same = _rate(0.4, 128, 1)
    f = compare(PASS, same, same, 0.95)
    assert f["diff"] == 0 and not f["regressed"]
    assert f["lower"] < 0 < f["upper"] and f["n"] == [128, 128]


def test_a_clear_drop_blocks_and_noise_within_the_margin_passes():
    base = _rate(0.4, 200, 1)
    assert compare(PASS, _rate(0.05, 200, 2), base, 0.95)["regressed"]
    assert not compare(PASS, _rate(0.38, 200, 3), base, 0.95)["regressed"]
    # a drop of the same size, but measured on few items, is not confident enough to block
    assert not compare(PASS, [True, False, False, False], [True, True, False, False], 0.95)["regressed"]


def test_bound_and_margin_both_matter():
    """Worse by 10 points on 2000 items: blocked with a 5-point margin, passed with a 20-point one."""
    base, cand = [True] * 1000 + [False] * 1000, [True] * 800 + [False] * 1200
    assert compare(PASS, cand, base, 0.95)["regressed"]
    assert not compare(Metric("pass_at_1", "proportion", "higher", 0.2), cand, base, 0.95)["regressed"]


def test_lower_is_better_metrics_block_on_a_rise():
    base = [False] * 200
    assert compare(EMPTY, [True] * 60 + [False] * 140, base, 0.95)["regressed"]
    assert not compare(EMPTY, [False] * 200, [True] * 60 + [False] * 140, 0.95)["regressed"]  # fewer empty: better


def test_answer_length_blocks_either_way_beyond_its_share():
    base = [10 + (i % 5) for i in range(100)]
    assert compare(LENGTH, [40 + (i % 5) for i in range(100)], base, 0.95)["regressed"]  # far longer
    assert compare(LENGTH, [1 + (i % 2) for i in range(100)], base, 0.95)["regressed"]  # far shorter
    assert not compare(LENGTH, [11 + (i % 5) for i in range(100)], base, 0.95)["regressed"]


def test_judge_blocks_on_any_regression_and_names_it():
    base = {"pass_at_1": _rate(0.4, 200, 1), "empty_or_refusal": [False] * 200}
    good = judge((PASS, EMPTY), base, base, 0.95)
    assert good.verdict == "pass" and set(good.figures) == {"pass_at_1", "empty_or_refusal"}
    worse = {"pass_at_1": base["pass_at_1"], "empty_or_refusal": [True] * 100 + [False] * 100}
    bad = judge((PASS, EMPTY), worse, base, 0.95)
    assert bad.verdict == "block" and "empty_or_refusal" in bad.reason and "pass_at_1" not in bad.reason
    assert bad.figures["empty_or_refusal"]["regressed"] and not bad.figures["pass_at_1"]["regressed"]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="no outcomes"):
        compare(PASS, [], [True], 0.95)
    with pytest.raises(ValueError, match="confidence"):
        judge((PASS,), {"pass_at_1": [True]}, {"pass_at_1": [True]}, 1.5)
    with pytest.raises(KeyError):
        judge((PASS,), {}, {"pass_at_1": [True]}, 0.95)
    with pytest.raises(ValueError, match="at least one"):
        SuiteConfig(samples=0)


def test_empty_and_refused_answers():
    assert empty_or_refusal("") and empty_or_refusal("  \n") and empty_or_refusal("I'm sorry, I can't do that")
    assert not empty_or_refusal("    return x + 1")
