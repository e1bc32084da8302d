"""Join the completions and feedback streams into rewarded samples.

Completions wait up to `window_s` for their feedback; one that gets none is dropped as "no signal" (an
ignored suggestion teaches nothing). Feedback before (or without) its completion waits `orphan_wait_s`, then
is dropped with a metric. Events are deduplicated by event_id (the gateway delivers at least once); rollout
completions never become user samples. Time is stream time (the newest event's ts), so replaying the same
records after a restart makes the same decisions; a caught-up caller advances it. The state round-trips
through state()/load_state() for the trainer's checkpoint.

Agent sessions (turns offered tools, following an earlier turn, or in a session the client named:
serving.signals.sessions): a turn waits `session_window_s` for feedback on itself or on its session. Feedback naming
a session (its outcome: edits kept, tests passed) turns each of its turns still waiting into a sample: turn k
of K, in stream order, gets the outcome's reward times `turn_discount ** (K - 1 - k)` (default 1: GRPO-style
trajectory reward). A turn judged on its own keeps its own reward. For `orphan_wait_s` after session feedback,
a turn of that session written before it (still in flight on another partition) joins on arrival, with the
whole outcome. With n > 1, only the choice a later turn continued from carries the outcome. The loss only
scores output tokens: what the environment wrote is never trained on as the policy's.

Verdicts read from agent sessions (kind implicit: tests passing or failing after an edit, a revert, a
correction, a repeated request, an abandoned session; serving.signals.implicit) judge the turn they name like
an accept or a reject, each with its own reward (RewardTable.signals); the first judgment of a turn decides.

Delayed signals (`cfg.signals`): `persisted` (is the accepted code still in the file after_s later) and
`comment` (the teacher's hint for text-feedback distillation: online_rl.trainer.loss). Under "persist" an accept
waits up to `delayed_window_s` for its persisted check; under "text" a reject waits up to `comment_wait_s`
for a comment. A signal before the judgment waits with the completion; a comment alone makes no sample; a
signal too late, unused by the mode, or on an agent turn is counted (late_signals, unused_signals) and joins
nothing. A hint goes at a line start of a left-to-right prompt, within `max_hint_tokens`. `held`: samples
waiting for a delayed signal. Tenants' privacy (online_rl.data.tenants): an event `refuse` refuses is never held;
drop_tenant forgets a tenant.

Why one file: the join is one state machine (pending, turns, held, orphans, closed sessions, judged keys)
whose every transition reads the others' state, and it checkpoints as one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, cast

import numpy as np

from contracts import events as ev
from online_rl.config import JoinConfig, RewardTable
from online_rl.data.samples import Sample
from online_rl.tasks.synthetic import hint_line

# What judges a completion when it is seen: the user's accept | reject | partial, or a verdict the gateway
# read from its agent session (kind implicit: serving.signals.implicit); the first of them decides.
JUDGMENTS = (*ev.IMMEDIATE_KINDS, ev.IMPLICIT)


def _is_turn(c: ev.CompletionEvent) -> bool:
    """A chat turn held for its session's outcome (offered tools, following a turn, or in a named session). A
    lone plain chat waits only `window_s`: the session window would hold it in memory and checkpoints 7x longer."""
    tools = c.sampling.get("tools") if isinstance(c.sampling, dict) else 0
    return bool(c.session_id) and bool(c.parent_id or c.session_id != c.completion_id or tools)


@dataclass
class JoinStats:
    consumed: int = 0
    duplicates: int = 0
    joined: int = 0
    no_signal: int = 0
    orphan_feedback: int = 0
    extra_feedback: int = 0
    rollout_events: int = 0
    bad_records: int = 0
    session_feedback: int = 0  # feedback naming a session that found at least one of its turns
    session_turns: int = 0  # samples made from a session's outcome (also counted in joined)
    orphan_session_feedback: int = 0  # feedback naming a session none of whose turns came in time
    delayed_signals: int = 0  # comments and persisted checks joined to their sample
    late_signals: int = 0  # delayed signals that came after their sample was made
    unused_signals: int = 0  # delayed signals the mode does not use (signals=basic; comments under persist)
    window_expired: int = 0  # samples made at the end of their wait, without the signal they waited for
    # samples judged by a verdict read from their agent session (serving.signals.implicit), by signal
    implicit_tests_pass: int = 0
    implicit_tests_fail: int = 0
    implicit_revert: int = 0
    implicit_correction: int = 0
    implicit_repeat: int = 0
    implicit_abandoned: int = 0


@dataclass
class Joiner:
    cfg: JoinConfig = field(default_factory=JoinConfig)
    rewards: RewardTable = field(default_factory=RewardTable)
    text_len: Callable[[list[int]], int] | None = None  # chars of a completion (for partial accepts)
    encode: Callable[[str], list[int]] | None = None  # text -> token ids (a comment's hint for the teacher)
    hint_fits: Callable[[np.ndarray], bool] | None = None  # does a prompt end where a hint line can go
    stats: JoinStats = field(default_factory=JoinStats)
    refuse: Callable[[object], str | None] | None = None  # why an event is never held (online_rl.data.tenants)

    def __post_init__(self):
        self.pending: OrderedDict[str, ev.CompletionEvent] = OrderedDict()  # by completion_id:choice
        self.turns: OrderedDict[str, ev.CompletionEvent] = OrderedDict()  # agent-session turns, the same keys
        self.sessions: dict[tuple[str, str], list[str]] = {}  # (tenant, session id) -> keys of waiting turns
        self.closed: OrderedDict[tuple[str, str], list] = OrderedDict()  # judged sessions: [feedback, turns joined]
        self.orphans: OrderedDict[str, list[ev.FeedbackEvent]] = OrderedDict()  # feedback before its completion
        # Waiting for a delayed signal, in order: key -> [completion, {kind: feedback}, stream time the wait began]
        self.held: OrderedDict[str, list] = OrderedDict()
        self.judged: OrderedDict[str, float] = OrderedDict()  # keys already turned into samples (late dupes)
        self._seen: set[str] = set()
        self._seen_order: deque[str] = deque()
        self.now = 0.0

    @staticmethod
    def _key(completion_id: str, choice: int) -> str:
        return f"{completion_id}:{choice}"

    def _remember(self, event_id: str) -> bool:
        """False if the event was seen before."""
        if event_id in self._seen:
            self.stats.duplicates += 1
            return False
        self._seen.add(event_id)
        self._seen_order.append(event_id)
        while len(self._seen_order) > self.cfg.dedupe_capacity:
            self._seen.discard(self._seen_order.popleft())
        return True

    def add_raw(self, raw: bytes) -> list[Sample]:
        try:
            event = ev.decode(raw)
        except ev.SchemaError:
            event = None
        if not isinstance(event, (ev.CompletionEvent, ev.FeedbackEvent)):  # a tenant record is not one either
            self.stats.bad_records += 1
            return []
        return self.add(event)

    def add(self, event) -> list[Sample]:
        """Feed one event; returns the samples it completes (zero or one)."""
        if not self._remember(event.event_id):
            return []
        self.stats.consumed += 1
        self.now = max(self.now, event.ts)
        if self.refuse is not None and self.refuse(event) is not None:
            return []
        if isinstance(event, ev.CompletionEvent):
            if event.source != "user":
                self.stats.rollout_events += 1
                return []
            key = self._key(event.completion_id, event.choice_index)
            orphans = self.orphans.pop(key, [])  # its feedback came first (a replayed spool)
            if _is_turn(event):
                skey = (event.tenant, event.session_id)
                closed = self.closed.get(skey)
                if closed is not None and event.ts <= closed[0].ts:  # a turn its session's outcome overtook
                    self.stats.session_feedback += closed[1] == 0
                    closed[1] += 1
                    self.stats.extra_feedback += len(orphans)
                    return [self._turn_sample(event, closed[0], 1.0)]
                self.turns[key] = event
                self.sessions.setdefault(skey, []).append(key)
            else:
                self.pending[key] = event
            return [s for f in orphans for s in self._completion_feedback(key, f)]
        if event.session_id:
            return self._session_feedback(event)
        return self._completion_feedback(self._key(event.completion_id, event.choice_index), event)

    def _uses(self, kind: str) -> bool:
        return kind == "persisted" and self.cfg.signals != "basic" or kind == "comment" and self.cfg.signals == "text"

    def _completion_feedback(self, key: str, f: ev.FeedbackEvent) -> list[Sample]:
        delayed = f.kind in ev.DELAYED_KINDS
        if delayed and not self._uses(f.kind):
            self.stats.unused_signals += 1
            return []
        if delayed and key in self.turns:  # an agent turn takes its session's outcome, not per-turn signals
            self.stats.unused_signals += 1
            return []
        held = self.held.get(key)
        if held is not None:
            signals, since = held[1], held[2]
            if self.now - since > self._wait_s(signals):  # its wait is over (expire() not yet called): late
                self.held.pop(key)
                self.stats.window_expired += 1
                self.stats.late_signals += delayed
                self.stats.extra_feedback += not delayed
                return self._expired(held[0], signals)
            if (
                f.kind in signals
                or (not delayed and any(k in signals for k in JUDGMENTS))
                or (f.kind == "persisted" and "reject" in signals)  # a check implies an accept: not this one
            ):
                self.stats.extra_feedback += 1
                return []
            signals[f.kind] = f
            return self._release_if_complete(key)
        completion = self.pending.pop(key, None)
        if completion is None:
            completion = self.turns.pop(key, None)
            if completion is not None:
                self._forget(key, completion)
        if completion is not None:
            if not delayed and not self._waits(f.kind, {}):
                return [self._sample(completion, {f.kind: f})]
            self.held[key] = [completion, {f.kind: f}, self.now]
            return self._release_if_complete(key)
        if key in self.judged:
            if delayed:
                self.stats.late_signals += 1
            else:
                self.stats.extra_feedback += 1
            return []
        waiting = self.orphans.setdefault(key, [])
        if any(o.kind == f.kind or (not delayed and o.kind in JUDGMENTS) for o in waiting):
            self.stats.extra_feedback += 1
        else:
            waiting.append(f)
        return []

    def _waits(self, judged: str | None, signals: dict) -> bool:
        """Whether a completion judged `judged` (None: not yet) with these signals waits for more."""
        if judged in ("accept", "partial") or (judged is None and "persisted" in signals):
            return self.cfg.signals != "basic" and "persisted" not in signals
        if judged == "reject":
            return self.cfg.signals == "text" and "comment" not in signals
        return judged is None  # only a comment so far: it waits for its judgment (or for the window)

    def _wait_s(self, signals: dict) -> float:
        return self.cfg.comment_wait_s if "reject" in signals else self.cfg.delayed_window_s

    def _expired(self, c: ev.CompletionEvent, signals: dict) -> list[Sample]:
        """A sample whose wait ended, on what it has. Only a comment, neither judged nor kept: no sample (a
        completion nobody judged teaches nothing; a reward for it would push it down against the baseline)."""
        if not any(k in signals for k in (*JUDGMENTS, "persisted")):
            self.stats.no_signal += 1
            return []
        return [self._sample(c, signals)]

    def _release_if_complete(self, key: str) -> list[Sample]:
        c, signals, _ = self.held[key]
        judged = next((k for k in JUDGMENTS if k in signals), None)
        if self._waits(judged, signals):
            return []
        del self.held[key]
        return [self._sample(c, signals)]

    def _sample(self, c: ev.CompletionEvent, signals: dict[str, ev.FeedbackEvent]) -> Sample:
        """One completion's sample from its feedback: a judgment (accept | reject | partial, or a session's
        outcome), and the delayed signals that came in time."""
        f = next((signals[k] for k in JUDGMENTS if k in signals), None)
        persisted, comment = signals.get("persisted"), signals.get("comment")
        need_len = (f is not None and f.kind == "partial") or (persisted is not None and persisted.edit_distance)
        total = self.text_len(list(c.output_ids)) if (self.text_len and need_len) else None
        if f is not None and f.kind == ev.IMPLICIT:
            reward = self.rewards.signal(f.signal)
            setattr(self.stats, f"implicit_{f.signal}", getattr(self.stats, f"implicit_{f.signal}") + 1)
        elif f is not None:
            reward = self.rewards.reward(f.kind, f.accepted_chars, total, score=f.score)
        elif persisted is not None:  # the code was in the file: it was accepted (its accept never came)
            reward = self.rewards.accept
        else:  # a comment alone never makes a sample (_expired)
            raise ValueError(f"{c.completion_id}: a sample needs a judgment or a persisted check")
        if persisted is not None:
            reward = self.rewards.combined(reward, bool(persisted.still_present), persisted.edit_distance, total)
        hint = None
        if comment is not None and self.encode is not None and (self.hint_fits is None or self.hint_fits(c.prompt_ids)):
            ids = self.encode(hint_line(comment.text or ""))  # never None: a withheld comment is dropped before
            hint = np.asarray(ids, dtype=np.int64) if len(ids) <= self.cfg.max_hint_tokens else None
        key = self._key(c.completion_id, c.choice_index)
        self.judged[key] = self.now
        self.stats.joined += 1
        self.stats.delayed_signals += (persisted is not None) + (comment is not None)
        return Sample(
            key=key,
            prompt_ids=c.prompt_ids,
            output_ids=c.output_ids,
            behaviour_logprobs=c.logprobs,
            routed_experts=c.routed_experts,
            reward=reward,
            model_version=c.model_version or 0,
            source="user",
            event_ids=(c.event_id, *(e.event_id for e in signals.values())),
            session=c.session_id,
            hint_ids=hint,
            tenant=c.tenant,
            ts=c.ts,
            baseline="implicit" if f is not None and f.kind == ev.IMPLICIT else "explicit",
        )

    def _session_feedback(self, f: ev.FeedbackEvent) -> list[Sample]:
        skey = (f.tenant, f.session_id)
        if skey in self.closed:
            self.stats.extra_feedback += 1
            return []
        waiting = [self.turns.pop(k) for k in self.sessions.pop(skey, []) if k in self.turns]
        waiting.sort(key=lambda c: c.ts)
        # With n > 1, a turn's other choices are alternatives the agent did not continue from: when a later
        # turn names one choice as its parent, only that one carries the outcome (a last turn's all do).
        parents = {c.parent_id for c in waiting if c.parent_id}
        continued = {p.rsplit(":", 1)[0] for p in parents}
        used = [
            c
            for c in waiting
            if c.completion_id not in continued or self._key(c.completion_id, c.choice_index) in parents
        ]
        self.stats.no_signal += len(waiting) - len(used)
        self.closed[skey] = [f, len(used)]
        if used:
            self.stats.session_feedback += 1
        order = {cid: k for k, cid in enumerate(dict.fromkeys(c.completion_id for c in used))}
        d, n = self.cfg.turn_discount, len(order)
        return [self._turn_sample(c, f, d ** (n - 1 - order[c.completion_id])) for c in used]

    def _forget(self, key: str, c: ev.CompletionEvent) -> None:
        """A turn no longer waits (judged on its own, or expired): out of its session's list."""
        skey = (c.tenant, c.session_id)
        left = [k for k in self.sessions.get(skey, []) if k != key and k in self.turns]
        if left:
            self.sessions[skey] = left
        else:
            self.sessions.pop(skey, None)

    def _turn_sample(self, c: ev.CompletionEvent, f: ev.FeedbackEvent, weight: float) -> Sample:
        self.stats.session_turns += 1
        s = self._sample(c, {f.kind: f})
        s.reward *= weight
        s.baseline = "session"  # discounted turns of sessions, whose success rate is not the autocomplete's
        return s

    def expire(self, now: float | None = None) -> list[Sample]:
        """Drop completions past their window and orphan feedback past its wait; make the samples whose wait
        for a delayed signal is over (returned)."""
        if now is not None:
            self.now = max(self.now, now)
        made = []
        # Two waits (a reject's for a comment is shorter), so a scan rather than a queue: under persist every
        # accepted completion waits here up to delayed_window_s, a scan of those per poll.
        for key in [k for k, (_, signals, since) in self.held.items() if self.now - since > self._wait_s(signals)]:
            c, signals, _ = self.held.pop(key)
            self.stats.window_expired += 1
            made += self._expired(c, signals)
        while self.pending:
            key, c = next(iter(self.pending.items()))
            if self.now - c.ts <= self.cfg.window_s:
                break
            self.pending.popitem(last=False)
            self.stats.no_signal += 1
        while self.turns:
            key, c = next(iter(self.turns.items()))
            if self.now - c.ts <= self.cfg.session_window_s:
                break
            self.turns.popitem(last=False)
            self.stats.no_signal += 1
            self._forget(key, c)
        while self.closed:
            skey, (f, joined) = next(iter(self.closed.items()))
            if self.now - f.ts <= self.cfg.orphan_wait_s:
                break
            self.closed.popitem(last=False)
            if not joined:
                self.stats.orphan_session_feedback += 1
        while self.orphans:
            key, fs = next(iter(self.orphans.items()))
            if self.now - fs[-1].ts <= self.cfg.orphan_wait_s:  # each key waits from its newest
                break
            self.orphans.popitem(last=False)
            self.stats.orphan_feedback += len(fs)
        # Late duplicates and late signals only matter within the windows: after them a key is forgotten.
        delayed = self.cfg.delayed_window_s if self.cfg.signals != "basic" else 0.0
        keep = max(self.cfg.window_s, delayed) + self.cfg.orphan_wait_s
        while self.judged:
            key, ts = next(iter(self.judged.items()))
            if self.now - ts <= keep:
                break
            self.judged.popitem(last=False)
        return made

    def drop_tenant(self, tenant: str, before: float) -> int:
        """Forget what is held of `tenant`'s events written at or before `before` (math.inf: all of them): waiting
        completions and turns, held samples (by their completion or any signal), orphan feedback, judged
        sessions (online_rl.data.tenants: a forget or a deny). Returns how many entries went."""

        def gone(e) -> bool:
            return e.tenant == tenant and e.ts <= before

        def drop(entries: dict, is_gone) -> int:
            keys = [k for k, v in entries.items() if is_gone(v)]
            for k in keys:
                del entries[k]
            return len(keys)

        n = drop(self.pending, gone) + drop(self.turns, gone) + drop(self.closed, lambda c: gone(c[0]))
        n += drop(self.held, lambda h: gone(h[0]) or any(map(gone, h[1].values())))
        for fs in self.orphans.values():
            n += sum(map(gone, fs))
            fs[:] = [f for f in fs if not gone(f)]
        drop(self.orphans, lambda fs: not fs)
        # a session's list names only the turns still waiting
        self.sessions = {s: ks for s, keys in self.sessions.items() if (ks := [k for k in keys if k in self.turns])}
        return n

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict:
        return {
            "pending": [c.encode() for c in self.pending.values()],
            "orphans": [f.encode() for fs in self.orphans.values() for f in fs],
            "held": [
                [c.encode(), [f.encode() for f in signals.values()], since] for c, signals, since in self.held.values()
            ],
            "turns": [c.encode() for c in self.turns.values()],
            "closed": [[f.encode(), joined] for f, joined in self.closed.values()],
            "judged": list(self.judged.items()),
            "seen": list(self._seen_order),
            "now": self.now,
            "stats": dict(vars(self.stats)),
        }

    def load_state(self, state: dict) -> None:
        self.__post_init__()
        # each list holds the kind of event save_state wrote there
        for raw in state["pending"]:
            c = cast(ev.CompletionEvent, ev.decode(raw))
            self.pending[self._key(c.completion_id, c.choice_index)] = c
        for raw in state["orphans"]:
            f = cast(ev.FeedbackEvent, ev.decode(raw))
            self.orphans.setdefault(self._key(f.completion_id, f.choice_index), []).append(f)
        for raw, signals, since in state.get("held", []):  # checkpoints before delayed signals have none
            c = cast(ev.CompletionEvent, ev.decode(raw))
            fs = [cast(ev.FeedbackEvent, ev.decode(r)) for r in signals]
            self.held[self._key(c.completion_id, c.choice_index)] = [c, {f.kind: f for f in fs}, since]
        for raw in state.get("turns", []):  # checkpoints written before sessions have none
            c = cast(ev.CompletionEvent, ev.decode(raw))
            key = self._key(c.completion_id, c.choice_index)
            self.turns[key] = c
            self.sessions.setdefault((c.tenant, c.session_id), []).append(key)
        for raw, joined in state.get("closed", []):
            f = cast(ev.FeedbackEvent, ev.decode(raw))
            self.closed[(f.tenant, f.session_id)] = [f, joined]
        self.judged = OrderedDict((k, ts) for k, ts in state["judged"])
        self._seen_order = deque(state["seen"])
        self._seen = set(self._seen_order)
        self.now = state["now"]
        self.stats = JoinStats(**{**vars(JoinStats()), **state["stats"]})
