"""The join of completions and feedback into rewarded samples (no broker: the Joiner alone)."""
import numpy as np
import pytest

from flywheel import events as ev
from online_rl.samples import LengthPenalty, RewardTable
from online_rl.stream import JoinConfig, Joiner


def completion(cid, ts, source="user", choice=0):
    return ev.CompletionEvent(completion_id=cid, choice_index=choice, tenant="t", model_version=2,
                              prompt_ids=np.array([0, 5, 6], np.int32), output_ids=np.array([7, 8], np.int32),
                              logprobs=np.array([-0.1, -0.2], np.float32),
                              routed_experts=np.zeros((4, 2, 2), np.uint8), sampling={}, finish_reason="stop",
                              latency={}, source=source, ts=ts)


def feedback(cid, kind, ts, choice=0, accepted=None):
    return ev.FeedbackEvent(completion_id=cid, choice_index=choice, tenant="t", kind=kind, accepted_chars=accepted,
                            ts=ts)


def test_join_rewards_and_dedupe():
    j = Joiner(JoinConfig(window_s=10), RewardTable(), text_len=lambda ids: 20)
    c = completion("a", 100.0)
    assert j.add(c) == []
    assert j.add(c) == []  # same event again: a duplicate
    [s] = j.add(feedback("a", "accept", 101.0))
    assert s.reward == 0.75 and s.model_version == 2 and s.key == "a:0" and len(s.event_ids) == 2
    assert j.add(feedback("a", "reject", 102.0)) == []  # a second opinion on a judged completion
    j.add(completion("b", 103.0))
    [p] = j.add(feedback("b", "partial", 104.0, accepted=10))
    assert p.reward == pytest.approx(0.375)
    assert (j.stats.duplicates, j.stats.joined, j.stats.extra_feedback) == (1, 2, 1)


def test_windows_expire_in_stream_time():
    j = Joiner(JoinConfig(window_s=10, orphan_wait_s=8))
    j.add(completion("slow", 100.0))
    j.add(feedback("ghost", "accept", 101.0))  # feedback whose completion never comes
    j.add(completion("other", 108.0))
    j.expire()
    assert "slow:0" in j.pending and "ghost:0" in j.orphans  # stream time 108: nothing expired yet
    j.add(completion("later", 112.0))
    j.expire()
    assert "slow:0" not in j.pending and j.stats.no_signal == 1
    assert "ghost:0" not in j.orphans and j.stats.orphan_feedback == 1
    assert j.add(feedback("slow", "accept", 113.0)) == []  # too late: now an orphan, never a sample


def test_feedback_before_completion_and_rollouts_ignored():
    j = Joiner()
    assert j.add(feedback("x", "reject", 50.0)) == []
    [s] = j.add(completion("x", 49.0))
    assert s.reward == -0.25
    assert j.add(completion("r", 51.0, source="rollout")) == [] and j.stats.rollout_events == 1
    assert j.add_raw(b"garbage") == [] and j.stats.bad_records == 1


def test_state_round_trip():
    j = Joiner(JoinConfig(window_s=10))
    j.add(completion("a", 1.0))
    j.add(feedback("z", "accept", 2.0))
    j.add(completion("b", 3.0))
    j.add(feedback("b", "accept", 4.0))
    k = Joiner(JoinConfig(window_s=10))
    k.load_state(j.state())
    assert list(k.pending) == ["a:0"] and list(k.orphans) == ["z:0"] and k.stats.joined == 1
    assert k.add(completion("b", 3.0)) == []  # its event id is remembered: a duplicate
    [s] = k.add(feedback("a", "accept", 5.0))
    assert s.key == "a:0"


def test_length_penalty_is_concave():
    lp = LengthPenalty(coef=0.1, power=0.5)
    assert lp(0) == 0 and lp(4) == pytest.approx(0.2) and lp(16) == pytest.approx(0.4)
    assert lp(16) - lp(12) < lp(4) - lp(0)
