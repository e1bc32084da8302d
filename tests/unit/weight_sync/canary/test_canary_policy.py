"""Canary judgement and the gateway's split, on figures alone (no servers)."""

import random

import pytest

from serving.canary_split import CanarySplit
from weight_sync.canary.controller import CanaryConfig
from weight_sync.canary.judge import judge
from weight_sync.publish import PublishConfig

CFG = CanaryConfig(
    gateway_url="http://unused",
    admin_token="t",
    publish=PublishConfig(store=".", private_key="."),
    min_feedback=100,
    min_requests=50,
    margin=0.05,
    confidence=0.95,
)


def arm(n, p, requests=None, errors=0, p99=100.0):
    accepts = round(n * p)
    return {
        "requests": requests if requests is not None else n,
        "errors": errors,
        "accepts": accepts,
        "rejects": n - accepts,
        "feedback": n,
        "acceptance": p,
        "p99_ms": p99,
    }


@pytest.mark.parametrize(
    "canary, stable, decision",
    [
        (arm(50, 0.1), arm(50, 0.5), "extend"),  # too little feedback yet
        (arm(300, 0.30), arm(300, 0.50), "rollback"),  # clearly worse
        (arm(300, 0.70), arm(300, 0.50), "promote"),  # clearly better
        (arm(2000, 0.50), arm(2000, 0.50), "promote"),  # neutral with enough evidence: within the margin
        (arm(150, 0.47), arm(150, 0.50), "extend"),  # neutral, not enough evidence yet
        (arm(300, 0.60, p99=400.0), arm(300, 0.50, p99=100.0), "rollback"),  # slower beyond the p99 ratio
        (arm(300, 0.60, errors=30), arm(300, 0.50), "rollback"),  # errors
    ],
)
def test_decisions(canary, stable, decision):
    v = judge(canary, stable, CFG)
    assert v.decision == decision, v
    assert v.reason and "canary" in v.figures


def tools(arm_figures, answers, malformed_rate):
    """An arm's figures with its tool-call answers, as GET /admin/canary reports them."""
    bad = round(answers * malformed_rate)
    return {
        **arm_figures,
        "tool_answers": answers,
        "tool_malformed": bad,
        "malformed_rate": bad / answers if answers else None,
    }


@pytest.mark.parametrize(
    "canary, stable, decision, why",
    [
        # worse malformed-call rate, with confidence: rolled back before any feedback and despite better acceptance
        (tools(arm(20, 0.5), 200, 0.30), tools(arm(20, 0.5), 200, 0.05), "rollback", "malformed tool calls"),
        (tools(arm(300, 0.70), 200, 0.30), tools(arm(300, 0.50), 200, 0.05), "rollback", "malformed tool calls"),
        # the same rate: the guard has no say, acceptance decides (both ways)
        (tools(arm(300, 0.70), 400, 0.10), tools(arm(300, 0.50), 400, 0.10), "promote", "acceptance"),
        (tools(arm(300, 0.30), 400, 0.10), tools(arm(300, 0.50), 400, 0.10), "rollback", "acceptance"),
        # better than stable, or worse only within the margin: passes
        (tools(arm(300, 0.70), 400, 0.02), tools(arm(300, 0.50), 400, 0.10), "promote", "acceptance"),
        (tools(arm(300, 0.70), 400, 0.12), tools(arm(300, 0.50), 400, 0.10), "promote", "acceptance"),
        # much worse, but too few tool answers on an arm: no verdict from this guard
        (tools(arm(300, 0.70), 99, 0.90), tools(arm(300, 0.50), 400, 0.0), "promote", "acceptance"),
        (tools(arm(20, 0.5), 400, 0.90), tools(arm(20, 0.5), 50, 0.0), "extend", "waiting for feedback"),
        # figures from a gateway without tool counts: judged on acceptance as before
        (arm(300, 0.70), arm(300, 0.50), "promote", "acceptance"),
    ],
)
def test_malformed_call_rate_guard(canary, stable, decision, why):
    v = judge(canary, stable, CFG)
    assert v.decision == decision and v.reason.startswith(why), v
    if canary.get("tool_answers", 0) >= CFG.tool_min_answers and stable.get("tool_answers", 0) >= CFG.tool_min_answers:
        assert {"malformed_rate_canary", "malformed_rate_stable", "malformed_diff_lower"} <= set(v.figures)
        assert v.figures["canary"]["tool_answers"] == canary["tool_answers"]
    else:
        assert "malformed_diff_lower" not in v.figures


def test_simulated_malformed_rates_reach_the_right_decision():
    """Judged at every answer, like the controller polling: a canary writing 15 points more malformed calls
    is rolled back; one at the stable rate never is (with acceptance out of the way: no feedback)."""
    rng = random.Random(1)
    for extra, want in ((0.15, "rollback"), (0.3, "rollback"), (0.0, "extend"), (-0.05, "extend")):
        c, s, verdict = {"n": 0, "bad": 0}, {"n": 0, "bad": 0}, None
        for _ in range(3000):
            for x, p in ((c, 0.1 + extra), (s, 0.1)):
                x["n"] += 1
                x["bad"] += rng.random() < p
            verdict = judge(*[{**arm(0, 0.0), "tool_answers": x["n"], "tool_malformed": x["bad"]} for x in (c, s)], CFG)
            if verdict.decision != "extend":
                break
        assert verdict.decision == want, (extra, verdict)


def test_split_keeps_a_user_on_one_arm_and_counts_per_arm():
    split = CanarySplit(version=3, replicas=frozenset({"r1"}), share=0.3)
    tenants = [f"t{i}" for i in range(2000)]
    arms = {t: split.arm_of(t) for t in tenants}
    assert all(split.arm_of(t) == arms[t] for t in tenants)  # sticky
    share = sum(a == "canary" for a in arms.values()) / len(tenants)
    assert 0.25 < share < 0.35
    other = CanarySplit(version=4, replicas=frozenset({"r1"}), share=0.3)
    assert sum(other.arm_of(t) != arms[t] for t in tenants) > 200  # a new trial reshuffles
    assert split.served("c1", "r1", 80.0) == "canary" and split.served("c2", "r0", 50.0) == "stable"
    split.feedback("c1", "accept")
    split.feedback("c2", "reject")
    split.feedback("unknown", "accept")  # issued before the trial: ignored
    v = split.view()["arms"]
    assert (v["canary"]["accepts"], v["stable"]["rejects"], v["canary"]["feedback"]) == (1, 1, 1)
    assert (v["canary"]["tool_answers"], v["canary"]["malformed_rate"]) == (0, None)
    split.tool_answer("r1", malformed=True, repeated=False)
    split.tool_answer("r1", malformed=False, repeated=True)
    split.tool_answer("r0", malformed=False, repeated=False)
    v = split.view()["arms"]
    assert [v["canary"][k] for k in ("tool_answers", "tool_malformed", "tool_repeated", "malformed_rate")] == [
        2,
        1,
        1,
        0.5,
    ]
    assert [v["stable"][k] for k in ("tool_answers", "tool_malformed", "malformed_rate")] == [1, 0, 0.0]


@pytest.mark.parametrize("share, replicas", [(0.0, {"r1"}), (1.0, {"r1"}), (0.5, set())])
def test_bad_splits_are_refused(share, replicas):
    with pytest.raises(ValueError):
        CanarySplit(version=1, replicas=frozenset(replicas), share=share)


def test_simulated_trials_reach_the_right_decision():
    rng = random.Random(0)
    for true_diff, want in ((-0.2, "rollback"), (-0.1, "rollback"), (0.1, "promote"), (0.2, "promote")):
        c, s, verdict = {"a": 0, "n": 0}, {"a": 0, "n": 0}, None
        while verdict is None or verdict.decision == "extend":
            for x, p in ((c, 0.5 + true_diff), (s, 0.5)):
                x["n"] += 1
                x["a"] += rng.random() < p
            figures = [
                {
                    "requests": x["n"],
                    "errors": 0,
                    "accepts": x["a"],
                    "rejects": x["n"] - x["a"],
                    "feedback": x["n"],
                    "acceptance": x["a"] / x["n"],
                    "p99_ms": 100.0,
                }
                for x in (c, s)
            ]
            verdict = judge(*figures, CFG)
        assert verdict.decision == want, (true_diff, verdict)


def test_first_feedback_per_choice_only():
    from serving.signals.first_feedback import FirstFeedback

    seen = FirstFeedback(capacity=3)
    assert seen.first("a", 0) and not seen.first("a", 0) and seen.first("a", 1)
    assert seen.first("b", 0) and seen.first("c", 0)  # capacity 3: ("a", 0) is forgotten
    assert seen.first("a", 0) and not seen.first("c", 0)
