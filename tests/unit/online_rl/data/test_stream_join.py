"""The join of completions and feedback into rewarded samples (no broker: the Joiner alone)."""

import pytest

from contracts import events as ev
from online_rl.config import JoinConfig, LengthPenalty, LossConfig, RewardTable
from online_rl.data.join import Joiner
from online_rl.data.samples import Sample
from online_rl.trainer.loss import advantages
from tests.helpers import completion_event as completion


def session_feedback(sid, kind, ts, score=None, tenant="t"):
    return ev.FeedbackEvent(
        completion_id="", choice_index=0, tenant=tenant, kind=kind, session_id=sid, score=score, ts=ts
    )


def feedback(cid, kind, ts, choice=0, accepted=None):
    return ev.FeedbackEvent(
        completion_id=cid, choice_index=choice, tenant="t", kind=kind, accepted_chars=accepted, ts=ts
    )


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


def test_a_session_outcome_is_spread_over_its_turns():
    j = Joiner(JoinConfig(window_s=10, session_window_s=100, turn_discount=0.5))
    for i, ts in enumerate((100.0, 101.0, 102.0)):
        assert j.add(completion(f"s{i}", ts, session="S")) == []
    j.add(completion("other-tenant", 101.5, session="S", tenant="u"))  # same session name, another tenant
    [own] = j.add(feedback("s1", "reject", 103.0))  # a turn judged on its own keeps its own reward
    assert own.reward == -0.25
    j.add(completion("late-chat", 140.0))
    j.expire()
    assert set(j.turns) == {"s0:0", "s2:0", "other-tenant:0"}  # past the chat window, within the session's
    turns = j.add(session_feedback("S", "accept", 141.0))
    assert [s.key for s in turns] == ["s0:0", "s2:0"]  # in stream order, this tenant's only
    assert [s.reward for s in turns] == [pytest.approx(0.375), pytest.approx(0.75)]  # 0.75 * 0.5 ** (K-1-k)
    assert all(s.session == "S" and len(s.event_ids) == 2 and s.baseline == "session" for s in turns)
    assert own.baseline == "explicit"
    assert j.add(session_feedback("S", "reject", 142.0)) == [] and j.stats.extra_feedback == 1
    assert (j.stats.session_feedback, j.stats.session_turns, j.stats.joined) == (1, 2, 3)
    assert "other-tenant:0" in j.turns


def test_session_feedback_overtaking_turns_and_partial_scores():
    j = Joiner(JoinConfig(orphan_wait_s=20))
    assert j.add(session_feedback("S", "partial", 50.0, score=0.4)) == []
    [late] = j.add(completion("t1", 49.0, session="S"))  # written before the outcome, read after it
    assert late.reward == pytest.approx(0.3) and late.session == "S"
    assert j.add(completion("t2", 55.0, session="S")) == []  # a turn after the outcome: not judged by it
    j.add(session_feedback("ghost", "accept", 60.0))  # a session none of whose turns ever come
    j.add(completion("x", 90.0))
    j.expire()
    assert j.stats.orphan_session_feedback == 1 and not j.closed  # S found a turn: not an orphan
    assert (j.stats.session_feedback, j.stats.session_turns) == (1, 1)  # S found its turn late


def test_session_state_round_trips_and_turns_expire():
    j = Joiner(JoinConfig(session_window_s=30))
    j.add(completion("a", 1.0, session="S"))
    j.add(session_feedback("Q", "accept", 2.0))
    k = Joiner(JoinConfig(session_window_s=30))
    k.load_state(j.state())
    assert list(k.turns) == ["a:0"] and list(k.closed) == [("t", "Q")]
    [s] = k.add(session_feedback("S", "accept", 3.0))
    assert s.key == "a:0"
    k.add(completion("b", 4.0, session="S2"))
    k.add(completion("c", 40.0))
    k.expire()
    assert not k.turns and not k.sessions and k.stats.no_signal == 1
    old = j.state()
    del old["turns"], old["closed"]  # a checkpoint written before sessions
    for name in ("session_feedback", "session_turns", "orphan_session_feedback"):
        del old["stats"][name]
    Joiner().load_state(old)


def test_feedback_names_a_completion_or_a_session():
    good = session_feedback("S", "accept", 1.0)
    assert ev.decode(good.encode()).session_id == "S"
    for bad in (
        ev.FeedbackEvent(completion_id="", choice_index=0, tenant="t", kind="accept"),
        ev.FeedbackEvent(completion_id="c", choice_index=0, tenant="t", kind="accept", session_id="S"),
    ):
        with pytest.raises(ev.SchemaError):
            ev.decode(bad.encode())


def test_which_chats_wait_for_their_session_and_leave_nothing_behind():
    j = Joiner(JoinConfig(window_s=10, session_window_s=100))
    lone = completion("lone", 1.0, session="lone")  # a plain chat: the gateway names its session after it
    tools = completion("tooled", 1.0, session="tooled")
    tools.sampling = {"tools": 3}  # offered tools: the first turn of an agent session
    follow = completion("next", 2.0, session="lone")
    follow.parent_id = "lone:0"
    for c in (lone, tools, follow):
        j.add(c)
    assert list(j.pending) == ["lone:0"] and list(j.turns) == ["tooled:0", "next:0"]
    [own] = j.add(feedback("next", "accept", 3.0))  # judged on its own: out of its session's list too
    assert own.key == "next:0" and ("t", "lone") not in j.sessions and list(j.sessions) == [("t", "tooled")]


def test_only_the_choice_an_agent_continued_from_carries_the_outcome():
    j = Joiner()
    first = [completion("one", 1.0, session="S", choice=i) for i in range(2)]  # n = 2
    second = completion("two", 2.0, session="S")
    second.parent_id = "one:1"
    for c in (*first, second):
        j.add(c)
    samples = j.add(session_feedback("S", "accept", 3.0))
    assert [s.key for s in samples] == ["one:1", "two:0"] and j.stats.no_signal == 1


def test_a_bad_feedback_record_is_refused_not_a_crash():
    for bad in (dict(kind="maybe"), dict(score="high"), dict(score=1.5), dict(session_id=["x"])):
        f = ev.FeedbackEvent(completion_id="", choice_index=0, tenant="t", kind="accept", session_id="S")
        for k, v in bad.items():
            setattr(f, k, v)
        j = Joiner()
        assert j.add_raw(f.encode()) == [] and j.stats.bad_records == 1


def test_an_implicit_verdict_is_judged_against_its_own_baseline():
    """A turn judged by a verdict read from its agent session is compared with other such turns, not with the
    autocomplete users' accepts: their rewards differ in scale (+0.5 at most against +0.75)."""
    j = Joiner(JoinConfig(window_s=10), RewardTable())
    j.add(completion("tab", 100.0))
    [tab] = j.add(feedback("tab", "accept", 101.0))
    j.add(completion("turn", 102.0, session="s"))
    implicit = ev.FeedbackEvent(
        completion_id="turn", choice_index=0, tenant="t", kind=ev.IMPLICIT, signal="tests_pass", ts=103.0
    )
    [turn] = j.add(implicit)
    assert (tab.baseline, turn.baseline, turn.reward) == ("explicit", "implicit", 0.5)
    cfg = LossConfig()
    # Most of the autocomplete is accepted (baseline 0.7); the agent's verdicts have averaged -0.1.
    adv, b = advantages([tab, turn], cfg, {"explicit": 0.7, "implicit": -0.1})
    assert adv == pytest.approx([0.05, 0.6])  # a passing test run is a good turn, whatever the autocomplete does
    assert b == pytest.approx({"explicit": 0.9 * 0.7 + 0.1 * 0.75, "implicit": 0.9 * -0.1 + 0.1 * 0.5})
    # A checkpoint from before implicit signals kept one float: the explicit baseline; the other starts at 0.
    adv, b = advantages([tab, turn], cfg, 0.7)
    assert adv == pytest.approx([0.05, 0.5]) and b["implicit"] == pytest.approx(0.05)
    # and the checkpointed sample keeps which baseline it is judged against
    assert Sample.from_state(turn.state()).baseline == "implicit"
