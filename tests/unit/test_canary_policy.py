"""Canary judgement and the gateway's split, on figures alone (no servers)."""
import random

import pytest

from serving.canary_split import CanarySplit
from weight_sync.canary import CanaryConfig, judge
from weight_sync.publish import PublishConfig

CFG = CanaryConfig(gateway_url="http://unused", admin_token="t", publish=PublishConfig(store=".", private_key="."),
                   min_feedback=100, min_requests=50, margin=0.05, confidence=0.95)


def arm(n, p, requests=None, errors=0, p99=100.0):
    accepts = round(n * p)
    return {"requests": requests if requests is not None else n, "errors": errors, "accepts": accepts,
            "rejects": n - accepts, "feedback": n, "acceptance": p, "p99_ms": p99}


@pytest.mark.parametrize("canary, stable, decision", [
    (arm(50, 0.1), arm(50, 0.5), "extend"),  # too little feedback yet
    (arm(300, 0.30), arm(300, 0.50), "rollback"),  # clearly worse
    (arm(300, 0.70), arm(300, 0.50), "promote"),  # clearly better
    (arm(2000, 0.50), arm(2000, 0.50), "promote"),  # neutral with enough evidence: within the margin
    (arm(150, 0.47), arm(150, 0.50), "extend"),  # neutral, not enough evidence yet
    (arm(300, 0.60, p99=400.0), arm(300, 0.50, p99=100.0), "rollback"),  # slower beyond the p99 ratio
    (arm(300, 0.60, errors=30), arm(300, 0.50), "rollback"),  # errors
])
def test_decisions(canary, stable, decision):
    v = judge(canary, stable, CFG)
    assert v.decision == decision, v
    assert v.reason and "canary" in v.figures


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
            figures = [{"requests": x["n"], "errors": 0, "accepts": x["a"], "rejects": x["n"] - x["a"],
                        "feedback": x["n"], "acceptance": x["a"] / x["n"], "p99_ms": 100.0} for x in (c, s)]
            verdict = judge(*figures, CFG)
        assert verdict.decision == want, (true_diff, verdict)


def test_first_feedback_per_choice_only():
    from serving.first_feedback import FirstFeedback

    seen = FirstFeedback(capacity=3)
    assert seen.first("a", 0) and not seen.first("a", 0) and seen.first("a", 1)
    assert seen.first("b", 0) and seen.first("c", 0)  # capacity 3: ("a", 0) is forgotten
    assert seen.first("a", 0) and not seen.first("c", 0)
