"""The completion event (contracts.events.CompletionEvent) built from what the gateway knows once a choice is
served: the request (its generation spec and prompt tokens), the replica's result, who asked, and where it was
routed; with the meta the spool keeps beside it (serving.event_log.sink): the tenant, the time, and the texts the
shipper scans for secrets before Kafka sees them (serving.event_log.scan).

A tenant whose training policy is `deny` is served and counted, but nothing the code wrote or saw is logged:
its event keeps the shape of the request and none of its content (`withheld` "policy"), and is not scanned.
"""

from __future__ import annotations

import numpy as np

from contracts import events as ev
from serving.protocol.openai import GenerationSpec, finish_reason
from serving.replica.engine import EngineResult


def completion_record(
    spec: GenerationSpec,
    res: EngineResult,
    *,
    completion_id: str,
    choice_index: int,
    tenant: str,
    prompt_ids: list[int],
    replica: str,
    timing: dict,
    source: str = "user",
    arm: str = "",
    withheld: bool = False,
    experts_shape: tuple[int, int] = (0, 0),
) -> tuple[ev.CompletionEvent, dict]:
    """The event of one choice and its spool meta. `tenant`: the tenant's id (hashed, never the key);
    `replica`, `arm`: which replica served it and, in a canary trial, on which arm; `timing`: ttft_ms and
    e2e_ms; `source`: "user" or "rollout"; `withheld`: the tenant's policy denies training on its traffic;
    `experts_shape`: the served model's (layers, top_k), the shape of routed experts when there are none."""
    spans = res.weight_versions or []
    switch = next((s.get("start") for s in spans[1:]), None) if len(spans) > 1 else None
    sampling = spec.sampling()
    no_experts = np.zeros((0, *experts_shape), np.uint8)
    event = ev.CompletionEvent(
        completion_id=completion_id,
        choice_index=choice_index,
        tenant=tenant,
        model_version=res.weight_version,
        prompt_ids=np.zeros(0, np.int32) if withheld else np.asarray(prompt_ids, np.int32),
        output_ids=np.zeros(0, np.int32) if withheld else np.asarray(res.output_ids, np.int32),
        logprobs=np.zeros(0, np.float32) if withheld else np.asarray(res.logprobs, np.float32),
        routed_experts=no_experts if withheld or res.routed_experts is None else res.routed_experts,
        sampling={k: v for k, v in sampling.items() if not isinstance(v, (str, list))} if withheld else sampling,
        finish_reason=finish_reason(res.finish),
        latency={**timing, "queue_ms": res.queue_ms},
        cached_tokens=res.cached_tokens,
        weight_versions=spans,
        switch_index=switch,
        source=source,
        replica=replica,
        arm=arm,
        session_id=spec.session.logged_id if spec.session is not None else "",  # scanned: serving.signals.session_ids
        parent_id=spec.session.parent_id if spec.session is not None else "",
        api=spec.api,
        withheld="policy" if withheld else "",
    )
    # The shipper scans these for secrets (serving.event_log.secret_scrub), off the request's thread, before Kafka
    # sees them: prompt, output and suffix as one text (a key the user began and the model finished spans the
    # seams), and the stop strings. Rollouts are the trainer's own tasks, never trained from the log: not scanned.
    scan = None if withheld or source != "user" else [spec.prompt + res.text + (spec.suffix or ""), *spec.stop]
    return event, {"tenant": tenant, "ts": event.ts, "scan": scan}
