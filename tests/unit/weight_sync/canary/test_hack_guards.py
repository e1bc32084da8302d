"""The canary's reward-hacking guards (weight_sync.canary.judge) on arms' figures as GET /admin/canary reports them:
each monitor's rate compared with a one-sided bound, a confident excess on the canary rolled back."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from weight_sync.canary.controller import CanaryConfig
from weight_sync.canary.judge import GUARDED, MonitorGuard, default_guards, judge
from weight_sync.publish import PublishConfig

CFG = CanaryConfig(gateway_url="http://unused", admin_token="t", publish=PublishConfig(store=".", private_key="."))


def arm(monitors: dict[str, tuple[int, int]] | None = None, accepts=270, feedback=300, length=(400, 40.0, 10.0)):
    """Acceptance well within the margin (both arms alike: promoted unless a guard objects), the monitors'
    (count, of), and (answers, mean tokens, standard deviation) of the answer length."""
    n, mean, sd = length
    figures = {
        "requests": 400,
        "errors": 0,
        "accepts": accepts,
        "rejects": feedback - accepts,
        "feedback": feedback,
        "p99_ms": 100.0,
        "length": {"answers": n, "tokens": round(n * mean), "tokens_sq": round(n * (sd * sd + mean * mean))},
    }
    if monitors is not None:
        figures["monitors"] = {k: {"count": c, "of": o} for k, (c, o) in monitors.items()}
    return figures


@pytest.mark.parametrize("monitor", GUARDED)
def test_a_confident_excess_of_any_monitor_rolls_back(monitor):
    hacked = judge(arm({monitor: (120, 400)}), arm({monitor: (20, 400)}), CFG)
    assert hacked.decision == "rollback" and monitor in hacked.reason, hacked
    assert hacked.figures[monitor]["canary"] == 0.3 and hacked.figures[monitor]["diff_lower"] > 0.05


@pytest.mark.parametrize("monitor", GUARDED)
def test_equal_arms_or_a_better_canary_are_not_rolled_back(monitor):
    for canary, stable in (((40, 400), (40, 400)), ((10, 400), (60, 400))):
        v = judge(arm({monitor: canary}), arm({monitor: stable}), CFG)
        assert v.decision == "promote", v


def test_an_excess_within_the_margin_or_with_too_few_answers_has_no_say():
    within = judge(arm({"clarifying": (70, 2000)}), arm({"clarifying": (20, 2000)}), CFG)  # 3.5% vs 1%: < 5 points
    assert within.decision == "promote", within
    few = judge(arm({"clarifying": (30, 50)}), arm({"clarifying": (1, 50)}), CFG)  # under min_count
    assert few.decision == "promote" and "clarifying" not in few.figures, few
    strict = replace(CFG, guards={**default_guards(), "clarifying": MonitorGuard(min_count=50, margin=0.05)})
    assert judge(arm({"clarifying": (30, 50)}), arm({"clarifying": (1, 50)}), strict).decision == "rollback"


def test_a_gateway_without_monitors_leaves_acceptance_to_decide():
    assert judge(arm(), arm(), CFG).decision == "promote"
    assert judge(arm(accepts=120), arm(), CFG).decision == "rollback"  # acceptance 40% vs 90%


def test_length_gaming():
    longer = judge(arm(length=(400, 90.0, 30.0)), arm(length=(400, 40.0, 10.0)), CFG)
    assert longer.decision == "rollback" and "tokens on average" in longer.reason, longer
    like = judge(arm(length=(400, 44.0, 12.0)), arm(length=(400, 40.0, 10.0)), CFG)  # 10% longer: within 50%
    assert like.decision == "promote", like
    noisy = judge(arm(length=(150, 70.0, 400.0)), arm(length=(150, 40.0, 10.0)), CFG)  # longer, not confidently
    assert noisy.decision == "promote", noisy


def test_simulated_trials_of_a_question_asking_canary():
    """Judged at every batch of answers, like the controller polling: a canary asking questions in 25% of its agent
    answers against stable's 5% is rolled back once the bound is confident, and never before min_count."""
    rng = random.Random(7)
    for _ in range(20):
        c = s = 0
        for n in range(10, 1001, 10):
            c += sum(rng.random() < 0.25 for _ in range(10))
            s += sum(rng.random() < 0.05 for _ in range(10))
            v = judge(arm({"clarifying": (c, n)}), arm({"clarifying": (s, n)}), CFG)
            if v.decision == "rollback":
                assert n >= CFG.guards["clarifying"].min_count
                break
        else:
            raise AssertionError("never rolled back")
