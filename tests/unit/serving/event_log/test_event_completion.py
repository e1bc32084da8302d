"""The completion event as the gateway builds it (serving.event_log.completion) from a request, the replica's
answer, who asked and where it went: what the event says, what the spool's meta asks the shipper to scan, and
what a tenant that denies training keeps out of the log. (The whole path, gateway to spool: test_dispatcher and
tests/integration/serving/test_gateway.py)"""

from __future__ import annotations

import numpy as np

from contracts import events as ev
from serving.event_log.completion import completion_record
from serving.protocol.openai import GenerationSpec
from serving.replica.engine import EngineResult
from serving.signals.sessions import Link


def _spec(**kw) -> GenerationSpec:
    return GenerationSpec(kind="chat", model="m", prompt="def f(x):", stop=["\n\n"], suffix=" # end", api="chat", **kw)


def _result() -> EngineResult:
    return EngineResult(
        output_ids=[5, 6, 7],
        text=" return x",
        logprobs=[-0.1, -0.2, -0.3],
        routed_experts=np.ones((5, 2, 1), np.uint8),
        finish={"type": "length"},
        weight_version=4,
        weight_versions=[{"version": 4, "start": 0, "end": 2}, {"version": 5, "start": 2, "end": 3}],
        cached_tokens=2,
        queue_ms=1.5,
    )


def _record(spec=None, **kw):
    args = dict(completion_id="c1", choice_index=0, tenant="t1", prompt_ids=[1, 2, 3], replica="r0")
    args.update(timing={"ttft_ms": 3.0, "e2e_ms": 9.0}, experts_shape=(2, 1), **kw)
    return completion_record(spec or _spec(), _result(), **args)


def test_the_event_says_what_was_served_where_and_survives_its_encoding():
    event, meta = _record(spec=_spec(session=Link("s", "c0", logged_id="s-logged")), arm="canary")
    back = ev.decode(event.encode(), ev.TOPIC_COMPLETIONS)
    assert (back.completion_id, back.choice_index, back.tenant, back.replica, back.arm) == (
        "c1",
        0,
        "t1",
        "r0",
        "canary",
    )
    assert back.model_version == 4 and back.switch_index == 2 and back.finish_reason == "length"
    assert back.prompt_ids.tolist() == [1, 2, 3] and back.output_ids.tolist() == [5, 6, 7]
    assert np.allclose(back.logprobs, [-0.1, -0.2, -0.3]) and back.routed_experts.shape == (5, 2, 1)
    assert back.latency == {"ttft_ms": 3.0, "e2e_ms": 9.0, "queue_ms": 1.5} and back.cached_tokens == 2
    assert (back.session_id, back.parent_id, back.api, back.withheld) == ("s-logged", "c0", "chat", "")
    assert back.sampling["stop"] == ["\n\n"] and back.source == "user"
    assert meta == {"tenant": "t1", "ts": event.ts, "scan": ["def f(x): return x # end", "\n\n"]}


def test_a_tenant_that_denies_training_is_logged_without_content_and_not_scanned():
    event, meta = _record(withheld=True)
    assert event.withheld == "policy" and meta["scan"] is None
    assert event.prompt_ids.size == event.output_ids.size == event.logprobs.size == 0
    assert event.routed_experts.shape == (0, 2, 1)  # the model's shape, no positions
    assert "stop" not in event.sampling and event.sampling["max_tokens"] == 16
    assert event.finish_reason == "length" and event.model_version == 4  # what was served is still counted
    assert ev.decode(event.encode(), ev.TOPIC_COMPLETIONS).withheld == "policy"


def test_a_rollout_is_not_scanned_and_a_reply_without_experts_gets_the_models_shape():
    event, meta = _record(source="rollout")
    assert event.source == "rollout" and meta["scan"] is None
    res = _result()
    res.routed_experts = None
    event, _ = completion_record(
        _spec(),
        res,
        completion_id="c",
        choice_index=1,
        tenant="t",
        prompt_ids=[1],
        replica="r",
        timing={},
        experts_shape=(3, 2),
    )
    assert event.routed_experts.shape == (0, 3, 2) and event.session_id == "" and event.parent_id == ""
