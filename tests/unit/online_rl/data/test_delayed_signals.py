"""Delayed signals in the join: persisted checks and comments join their completion within the windows,
exactly once, and the reward orders accepted and kept > accepted then deleted > ignored > rejected."""

import warnings

import numpy as np
import pytest

from contracts import events as ev
from online_rl.config import JoinConfig, RewardTable
from online_rl.data.join import Joiner
from online_rl.data.samples import Sample
from online_rl.tasks.synthetic import hint_line
from tests.unit.online_rl.data.test_stream_join import completion, feedback


def persisted(cid, ts, still=True, after=60.0, edit=None):
    return ev.FeedbackEvent(
        completion_id=cid, choice_index=0, tenant="t", kind="persisted", still_present=still, after_s=after,
        edit_distance=edit, ts=ts,
    )  # fmt: skip


def comment(cid, ts, text="use x + 3"):
    return ev.FeedbackEvent(completion_id=cid, choice_index=0, tenant="t", kind="comment", text=text, ts=ts)


def encode(text: str) -> list[int]:
    return [ord(ch) % 50 for ch in text]  # a stand-in tokenizer: ids only need to be stable here


def joiner(signals="text", **kw) -> Joiner:
    cfg = JoinConfig(signals=signals, window_s=30, delayed_window_s=600, comment_wait_s=60, orphan_wait_s=20, **kw)
    return Joiner(cfg, RewardTable(), text_len=lambda ids: 20, encode=encode)


def test_default_rewards_keep_the_order_and_a_bad_table_is_refused():
    r = RewardTable()
    kept, deleted = r.combined(r.accept, True), r.combined(r.accept, False)
    assert kept > deleted > 0.0 > r.reject
    assert (kept, deleted) == pytest.approx((0.875, 0.125))
    # edited: between deleted and kept, by the share of characters left alone
    assert r.combined(r.accept, True, edit_distance=10, total_chars=20) == pytest.approx((kept + deleted) / 2)
    with pytest.raises(ValueError, match="accepted and kept > accepted then deleted"):
        RewardTable(deleted=-2.0)  # accepted then deleted would fall under ignored
    with pytest.raises(ValueError, match="persist_weight"):
        RewardTable(persist_weight=1.5)


def test_an_accept_waits_for_its_persisted_check_and_joins_it_once():
    j = joiner("persist")
    j.add(completion("a", 100.0))
    assert j.add(feedback("a", "accept", 101.0)) == []  # waiting for its check
    assert len(j.held) == 1
    [s] = j.add(persisted("a", 160.0, still=False))
    assert s.reward == pytest.approx(0.125) and len(s.event_ids) == 3 and s.hint_ids is None
    assert j.add(persisted("a", 400.0, still=True)) == []  # a second check: late, joins nothing
    assert (j.stats.joined, j.stats.delayed_signals, j.stats.late_signals) == (1, 1, 1)
    assert not j.held


def test_a_sample_waits_at_most_the_window_then_trains_on_what_it_has():
    j = joiner("persist")
    j.add(completion("a", 100.0))
    j.add(feedback("a", "accept", 101.0))
    assert j.expire(101.0 + 600) == []  # still inside the window
    [s] = j.expire(101.0 + 601)
    assert s.reward == pytest.approx(0.75) and j.stats.window_expired == 1
    assert j.add(persisted("a", 800.0)) == []  # after its sample: late
    assert j.stats.late_signals == 1


def test_a_rejection_waits_for_a_comment_only_under_text_and_carries_it_as_the_hint():
    j = joiner("persist")
    j.add(completion("r", 100.0))
    [s] = j.add(feedback("r", "reject", 101.0))  # persist: a rejection has nothing to wait for
    assert s.reward == -0.25
    assert j.add(comment("r", 103.0)) == [] and j.stats.unused_signals == 1  # persist does not use comments

    j = joiner("text")
    j.add(completion("r", 100.0))
    assert j.add(feedback("r", "reject", 101.0)) == []
    [s] = j.add(comment("r", 103.0, "use x + 3"))
    assert s.reward == -0.25 and s.hint_ids.tolist() == encode(hint_line("use x + 3"))
    # no comment comes: trained after comment_wait_s, not the persistence window
    j.add(completion("q", 200.0))
    j.add(feedback("q", "reject", 201.0))
    assert j.expire(262.0)[0].hint_ids is None


def test_basic_ignores_delayed_signals_and_trains_at_once():
    j = joiner("basic")
    j.add(completion("a", 100.0))
    [s] = j.add(feedback("a", "accept", 101.0))
    assert s.reward == 0.75
    assert j.add(persisted("a", 160.0, still=False)) == [] and j.add(comment("a", 161.0)) == []
    assert j.stats.unused_signals == 2 and j.stats.late_signals == 0


def test_a_deleted_accept_with_a_comment_carries_both():
    j = joiner("text")
    j.add(completion("a", 100.0))
    j.add(feedback("a", "accept", 101.0))
    assert j.add(comment("a", 150.0, "use 3, not 4")) == []  # an accepted one waits for its check
    [s] = j.add(persisted("a", 151.0, still=False))
    assert s.reward == pytest.approx(0.125) and s.hint_ids is not None and len(s.event_ids) == 4


def test_signals_before_the_judgment_or_the_completion_wait_for_it():
    j = joiner("text")
    # a persisted check alone: the code was in the file, so it was accepted
    j.add(completion("p", 100.0))
    [s] = j.add(persisted("p", 150.0, still=True))
    assert s.reward == pytest.approx(0.875)
    # feedback, then a comment, before their completion (a replayed spool): joined when it comes
    j.add(feedback("o", "reject", 101.0))
    j.add(comment("o", 102.0))
    [s] = j.add(completion("o", 100.0))
    assert s.reward == -0.25 and s.hint_ids is not None and len(s.event_ids) == 3
    # a repeated judgment is one more opinion, not a second sample
    j.add(completion("d", 100.0))
    j.add(feedback("d", "accept", 101.0))
    assert j.add(feedback("d", "accept", 102.0)) == [] and j.stats.extra_feedback == 1


def test_waiting_samples_survive_a_checkpoint_and_join_once_after_it():
    j = joiner("text")
    j.add(completion("a", 100.0))
    j.add(feedback("a", "accept", 101.0))
    j.add(comment("a", 102.0))
    j.add(feedback("z", "reject", 103.0))  # an orphan, waiting for its completion
    k = joiner("text")
    k.load_state(j.state())
    assert list(k.held) == ["a:0"] and list(k.orphans) == ["z:0"]
    [s] = k.add(persisted("a", 130.0, still=True))
    assert s.hint_ids is not None and s.reward == pytest.approx(0.875)
    assert k.add(persisted("a", 131.0)) == [] and k.stats.late_signals == 1
    # the sample round-trips through the trainer's checkpoint with its hint
    back = Sample.from_state(s.state())
    assert np.array_equal(back.hint_ids, s.hint_ids)


def test_a_sample_of_read_only_arrays_checkpoints_without_sharing_them():
    # Events decoded from Kafka are read-only views of their message. torch.from_numpy of one warns (once a
    # process, so the warning check depends on test order) and writes through to it: the last assertion is
    # the one that fails without the copy.
    s = _sample()
    for a in (s.prompt_ids, s.output_ids, s.behaviour_logprobs, s.routed_experts, s.hint_ids):
        a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = s.state()
    assert state["prompt_ids"].tolist() == s.prompt_ids.tolist() and state["hint_ids"].tolist() == [7, 8]
    state["prompt_ids"][0] = 99  # a copy: the event's bytes stay as they were
    assert s.prompt_ids[0] == 1


def _sample() -> Sample:
    return Sample(
        key="k:0",
        prompt_ids=np.array([1, 2, 3], np.int32),
        output_ids=np.array([4, 5], np.int32),
        behaviour_logprobs=np.array([-0.5, -0.25], np.float32),
        routed_experts=np.zeros((4, 2, 2), np.uint8),
        reward=1.0,
        model_version=0,
        hint_ids=np.array([7, 8], np.int32),
    )


def test_bad_delayed_signals_are_refused_by_the_schema():
    def bad(**kw):
        f = ev.FeedbackEvent(completion_id="a", choice_index=0, tenant="t", **kw)
        with pytest.raises(ev.SchemaError):
            ev.decode(f.encode())

    bad(kind="comment")  # no text
    bad(kind="comment", text="line one\nline two")  # a control character
    bad(kind="comment", text="x" * 2049)
    bad(kind="persisted", still_present=True)  # no after_s
    bad(kind="persisted", still_present="yes", after_s=1.0)
    bad(kind="persisted", still_present=True, after_s=-1.0)
    bad(kind="persisted", still_present=True, after_s=1.0, edit_distance=-2)
    j = joiner("text")
    assert j.add_raw(b"\x81\xa6schema\xa9bad") == [] and j.stats.bad_records == 1


def test_a_signal_after_its_wait_is_late_even_before_expire_runs():
    """Replaying a backlog in one poll must decide as live reading did: the window is checked on arrival."""
    j = joiner("text")
    j.add(completion("r", 100.0))
    j.add(feedback("r", "reject", 101.0))
    [s] = j.add(comment("r", 400.0))  # comment_wait_s is 60: the sample is made without it
    assert s.hint_ids is None and s.reward == -0.25
    assert (j.stats.late_signals, j.stats.window_expired) == (1, 1)


def test_a_persisted_check_after_a_reject_is_not_an_accept():
    j = joiner("text")
    j.add(completion("r", 100.0))
    j.add(feedback("r", "reject", 101.0))
    assert j.add(persisted("r", 102.0, still=True)) == [] and j.stats.extra_feedback == 1
    [s] = j.add(comment("r", 103.0))
    assert s.reward == -0.25  # not (1 - w) * -0.25 + w * kept


def test_a_comment_alone_makes_no_sample():
    j = joiner("text")
    j.add(completion("c", 100.0))
    assert j.add(comment("c", 101.0)) == []
    assert j.expire(101.0 + 601) == [] and j.stats.no_signal == 1 and j.stats.joined == 0


def test_agent_turns_take_their_sessions_outcome_not_delayed_signals():
    from tests.unit.online_rl.data.test_stream_join import session_feedback

    j = joiner("text")
    j.add(completion("t1", 100.0, session="s"))
    j.add(completion("t2", 101.0, session="s"))
    assert j.add(comment("t1", 102.0)) == [] and j.add(persisted("t2", 103.0)) == []
    assert j.stats.unused_signals == 2
    samples = j.add(session_feedback("s", "accept", 104.0))
    assert sorted(s.key for s in samples) == ["t1:0", "t2:0"] and all(s.reward == 0.75 for s in samples)
    # a turn whose own judgment came before it (a replayed spool) is judged on its own, like a completion,
    # and leaves its session's list
    j.add(feedback("t3", "reject", 105.0))
    assert j.add(completion("t3", 100.5, session="s2")) == []  # a reject waits for its comment (text)
    assert "t3:0" in j.held and "t3:0" not in j.turns and ("t", "s2") not in j.sessions
    [s] = j.add(comment("t3", 106.0))
    assert s.reward == -0.25 and s.hint_ids is not None


def test_orphans_of_one_completion_wait_from_the_newest():
    j = joiner("text")
    j.add(comment("o", 100.0))
    j.add(feedback("o", "reject", 115.0))
    j.expire(121.0)  # 21 s after the comment, 6 s after the reject: both still wait
    [s] = j.add(completion("o", 99.0))
    assert s.hint_ids is not None and j.stats.orphan_feedback == 0


def test_negative_windows_are_refused():
    with pytest.raises(ValueError, match="comment_wait_s"):
        JoinConfig(comment_wait_s=-1)
