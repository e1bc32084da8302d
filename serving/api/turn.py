"""One turn of a conversation on the fleet, whichever API asked for it (chat, Responses, Messages).

    GenerationSpec (messages rendered, tools checked) --prompter--> token ids (max_tokens clamped if asked)
        --sessions.link--> session, previous turn --dispatcher--> EngineResult (streamed: text as it comes,
        a possible call held back) --tool_calls.parse--> content + calls --> completion event (on disk)

Every API lands here, so a turn of Codex on /v1/responses and of Claude Code on /v1/messages is the same
completion event, session link, tool-call count, canary vote and tenant policy as a chat completion's: one
event schema, one path to Kafka. The APIs differ only in the shapes they read and write around it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts import events as ev
from serving.auth import Tenant
from serving.protocol import tool_calls as tc
from serving.protocol.openai import GenerationSpec, finish_reason
from serving.protocol.schema import ApiError
from serving.replica import engine
from serving.signals import hacking
from serving.signals.sessions import MAX_SESSION_ID, Link

if TYPE_CHECKING:
    from serving.auth import CompletionIds
    from serving.event_log.sink import EventSink
    from serving.metrics import GatewayMetrics
    from serving.protocol.limits import Limits
    from serving.protocol.prompts import Prompter
    from serving.routing.dispatcher import Dispatcher
    from serving.signals.implicit import ImplicitSignals, Signal
    from serving.signals.session_ids import SessionIds
    from serving.signals.sessions import Sessions

OnText = Callable[[str, bool], Awaitable[None]]  # (content delta, first chunk of the answer)


@dataclass
class TurnParts:
    """What a turn uses of the gateway's state (serving.gateway builds one for the APIs that run turns)."""

    limits: Limits
    model_name: str
    prompter: Prompter
    ids: CompletionIds
    dispatcher: Dispatcher
    sink: EventSink
    metrics: GatewayMetrics
    sessions: Sessions
    session_ids: SessionIds
    implicit: ImplicitSignals
    signal: Callable[[str, Signal], None]  # a verdict read from a session, logged as feedback (FeedbackApi.signal)


@dataclass
class Turn:
    cid: str
    res: engine.EngineResult
    replica_id: str
    content: str  # the answer's text ("" when it only called tools)
    calls: list[dict] = field(default_factory=list)  # [{id, name, arguments (a JSON string)}]
    finish: str = "stop"  # stop | length | tool_calls
    prompt_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.res.output_ids)

    @property
    def version(self) -> int | None:
        return self.res.weight_version


def remember(
    parts: TurnParts, tenant: Tenant, spec: GenerationSpec, cid: str, i: int, content, calls: list[dict]
) -> None:
    """An answer, as the client will send it back next turn (serving.signals.sessions). calls: OpenAI tool_calls."""
    answer = {
        "role": "assistant",
        "content": content or "",
        "calls": [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls
        ],
    }
    parts.sessions.record(tenant.id, _messages(spec), answer, f"{cid}:{i}", _link(spec).session_id)


def remember_choice(
    parts: TurnParts, tenant: Tenant, spec: GenerationSpec, cid: str, i: int, content: str | None, calls: list[dict]
) -> None:
    """Choice i of a completion's n, remembered for its session (calls: OpenAI tool_calls); the answer the
    session continues from only when n is 1 (of n > 1, the client's pick is unknown)."""
    remember(parts, tenant, spec, cid, i, content, calls)
    if spec.n == 1:
        answered(parts, tenant, spec, cid, i, calls)


def count_tools(
    parts: TurnParts,
    parsed: tc.Parsed,
    spec: GenerationSpec,
    tenant: Tenant,
    cid: str,
    i: int,
    res: engine.EngineResult,
    replica_id: str,
) -> None:
    """Counts an answer's calls by outcome and by the version that wrote them, the calls repeating an
    earlier one of the session, and, during a canary trial, the tool answer on its arm."""
    if parsed.outcome == "none":
        return
    repeated = 0
    if parsed.calls and spec.session is not None:
        repeated = parts.sessions.repeated_calls(tenant.id, spec.session.session_id, parsed.calls, cid, i)
    parts.metrics.monitors.count(res.weight_version, parsed.outcome, max(1, len(parsed.calls)), repeated)
    if parts.dispatcher.canary is not None:
        parts.dispatcher.canary.tool_answer(replica_id, parsed.outcome in tc.MALFORMED, repeated > 0)


def monitor_answer(
    parts: TurnParts,
    spec: GenerationSpec,
    tenant: Tenant,
    res: engine.EngineResult,
    replica_id: str,
    content: str | None,
    calls: list[dict],
) -> None:
    """The reward-hacking detectors (serving.signals.hacking) on any answer (calls: OpenAI tool_calls), counted for
    the version that wrote it and, during a trial, on its arm; its calls remembered, so that their results, when
    the client sends them back, count for the same version and arm."""
    agent = spec.tools is not None and spec.tools.active
    tokens = len(res.output_ids)
    flags = hacking.flags(agent, content, calls, finish_reason(res.finish), tokens)
    parts.metrics.monitors.answer(res.weight_version, agent, flags, tokens)
    canary = parts.dispatcher.canary
    if canary is not None:
        canary.answer(replica_id, agent, flags, tokens)
    if calls:
        trial, arm = (canary.version, canary.arm_of_replica(replica_id)) if canary is not None else (None, "")
        parts.metrics.monitors.calls_made(tenant.id, [c["id"] for c in calls], res.weight_version, trial, arm)


def count_results(parts: TurnParts, tenant: Tenant, messages: list[dict]) -> None:
    """The tool results this request brings (those after its last assistant message): each counted, failed or not,
    for the version (and trial arm) whose call it answers (serving.monitors: once per call)."""
    for m in reversed(messages):
        if m["role"] == "assistant":
            break
        if m["role"] != "tool":
            continue
        failed = hacking.failed_result(m.get("content"), bool(m.get("is_error")))
        made = parts.metrics.monitors.tool_result(tenant.id, m.get("tool_call_id") or "", failed)
        canary = parts.dispatcher.canary
        if made is not None and canary is not None and made[0] == canary.version:
            canary.tool_result(made[1], failed)


def session_hint(parts: TurnParts, tenant: Tenant, given: str | None) -> str | None:
    """A session id the client named (X-Session-Id, metadata.session_id, ...), checked: printable ASCII, and
    one of our derived ids (`cmpl-...`) only if it was issued to this key."""
    if given is None:
        return None
    if not given.isascii() or not given.isprintable() or not 0 < len(given) <= MAX_SESSION_ID:
        what = f"a session id is 1-{MAX_SESSION_ID} printable ASCII characters"
        raise ApiError(400, what, param="session_id", code="invalid_value")
    if given.startswith("cmpl-"):  # our ids' shape: only one we issued to this key
        try:
            parts.ids.check(tenant, given)
        except ApiError:
            raise ApiError(
                400,
                "a session id that starts with 'cmpl-' must be one this server derived for "
                "this API key (name your own sessions otherwise)",
                param="session_id",
                code="invalid_value",
            ) from None
    return given


def _messages(spec: GenerationSpec) -> list[dict]:
    assert spec.messages is not None, "a conversation's spec holds its messages"
    return spec.messages


def _link(spec: GenerationSpec) -> Link:
    assert spec.session is not None, "link_session() linked it"
    return spec.session


def link_session(parts: TurnParts, tenant: Tenant, spec: GenerationSpec, cid: str) -> None:
    """The turn's session and previous turn, and the verdicts on that turn the client's request carries
    (serving.signals.implicit), logged as feedback."""
    spec.session = link = parts.sessions.link(tenant.id, _messages(spec), spec.session_hint, cid)
    count_results(parts, tenant, _messages(spec))
    link.logged_id = parts.session_ids.logged(tenant.id, link.session_id, parts.ids.owner(link.session_id) == tenant.id)
    for signal in parts.implicit.observe(tenant.id, link.session_id, link.parent_id, _messages(spec)):
        parts.signal(tenant.id, signal)


def answered(parts: TurnParts, tenant: Tenant, spec: GenerationSpec, cid: str, i: int, calls: list[dict]) -> None:
    """The turn's answer, for the session's later verdicts; calls: OpenAI tool_calls."""
    flat = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    for signal in parts.implicit.answered(tenant.id, _link(spec).session_id, f"{cid}:{i}", flat):
        parts.signal(tenant.id, signal)


async def run_turn(
    parts: TurnParts,
    path: str,
    tenant: Tenant,
    spec: GenerationSpec,
    cid: str,
    on_text: OnText | None = None,
    id_prefix: str = "call_",
) -> Turn:
    """One choice of a conversation under the completion id `cid` (parts.ids.issue: the API names its answer
    after it before the first token): streamed when `on_text` is given (content deltas, a call held back
    until the answer is whole). Returns once its completion event is on disk (or the durable wait is over)."""
    prompt_ids = await parts.prompter.prompt_ids(spec)
    link_session(parts, tenant, spec, cid)
    stream = on_text is not None
    body = engine.payload(prompt_ids, parts.prompter.sampling(spec), 0, stream, f"{cid}-0")
    active = spec.tools is not None and spec.tools.active
    split = tc.StreamSplitter(spec.tools, spec.prefill, id_prefix) if active and stream else None
    t0, first, last = time.monotonic(), [True], list[float | None]([None])

    async def on_chunk(delta: str, res: engine.EngineResult) -> None:
        now = time.monotonic()
        if first[0]:
            parts.metrics.ttft.labels(path).observe(now - t0)
        elif last[0] is not None:
            parts.metrics.itl.labels(path).observe(now - last[0])
        last[0] = now
        if split is not None:
            delta = split.feed(delta)
        if (delta or first[0]) and on_text is not None:  # (it is: a stream)
            await on_text(delta, first[0])
        first[0] = False

    res, replica_id, timing = await parts.dispatcher.run_choice(
        body, stream, on_chunk if stream else None, tenant=tenant.id
    )
    fr = finish_reason(res.finish)
    if split is not None:
        tail = split.feed(tc.trimmed_close(res.finish))
        rest, parsed = await split.finish_off_loop()
        if tail + rest and on_text is not None:  # (it is: a stream)
            await on_text(tail + rest, False)
    elif active:
        parsed = await tc.parse_off_loop(spec.prefill + res.text + tc.trimmed_close(res.finish), spec.tools, id_prefix)
    else:
        parsed = tc.Parsed(content=res.text)
    count_tools(parts, parsed, spec, tenant, cid, 0, res, replica_id)
    monitor_answer(parts, spec, tenant, res, replica_id, parsed.content, parsed.calls)
    if parsed.calls:
        fr = "tool_calls"
    elif parsed.outcome != "none" and fr != "length":
        fr = "stop"  # a call the model got wrong comes back as its text (a cut-off one says length)
    remember(parts, tenant, spec, cid, 0, parsed.content, parsed.calls)
    answered(parts, tenant, spec, cid, 0, parsed.calls)
    durable = parts.dispatcher.log_completion(tenant, spec, cid, 0, prompt_ids, res, replica_id, timing)
    await parts.sink.wait([durable], ev.TOPIC_COMPLETIONS)
    parts.metrics.e2e.labels(path).observe(time.monotonic() - t0)
    calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in parsed.calls
    ]
    return Turn(cid, res, replica_id, parsed.content or "", calls, fr, len(prompt_ids))
