"""A completion streamed as server-sent events, OpenAI's chunk shapes, n choices interleaved.

Nothing is sent before the first token (an error before then is a normal error response); an error after
it is sent as an error chunk and `[DONE]`. A client that leaves stops every choice (and its replica's
work). `[DONE]` goes out only once the completion events are on disk: the client's sign it is whole.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from contracts import events as ev
from serving.api import turn
from serving.api.respond import SESSION_HEADER, VERSION_HEADER, fingerprint
from serving.auth import Tenant
from serving.protocol import tool_calls as tc
from serving.protocol.openai import GenerationSpec, finish_reason, usage
from serving.protocol.schema import ApiError
from serving.replica import engine
from serving.routing.dispatcher import ClientGone

if TYPE_CHECKING:
    from serving.api.turn import TurnParts


async def stream_choices(
    parts: TurnParts,
    request: web.Request,
    tenant: Tenant,
    spec: GenerationSpec,
    cid: str,
    prompt_ids: list[int],
    bodies: list[dict],
    created: int,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            VERSION_HEADER: parts.dispatcher.pool_version(),
            **({SESSION_HEADER: spec.session.session_id} if spec.session else {}),
        }
    )
    obj = "text_completion" if spec.kind == "completion" else "chat.completion.chunk"
    t0 = time.monotonic()
    last_chunk: list[float | None] = [None]
    write_lock = asyncio.Lock()
    started = [False]
    durable: list = []

    async def send(payload: dict | bytes) -> None:
        async with write_lock:
            try:
                if not started[0]:
                    await resp.prepare(request)
                    started[0] = True
                await resp.write(payload if isinstance(payload, bytes) else b"data: " + orjson.dumps(payload) + b"\n\n")
            except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
                raise ClientGone() from None

    def chunk(i: int, text: str, fr: str | None, res=None, first=False, calls=None) -> dict:
        version = res.weight_version if res is not None else None
        if spec.kind == "completion":
            c = {"index": i, "text": text, "logprobs": None, "finish_reason": fr}
        else:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            if calls is not None:
                delta = {"tool_calls": calls}
            c = {"index": i, "delta": delta, "logprobs": None, "finish_reason": fr}
        out = {
            "id": cid,
            "object": obj,
            "created": created,
            "model": spec.model,
            "model_version": version,
            "system_fingerprint": fingerprint(version),
            "choices": [c],
        }
        if spec.session is not None:
            out["session_id"] = spec.session.session_id
        return out

    async def send_calls(i: int, res: engine.EngineResult, calls: list[dict]) -> None:
        for k, call in enumerate(calls):  # OpenAI's shape: the call's id and name, then its arguments
            head = {"index": k, "id": call["id"], "type": "function"}
            head["function"] = {"name": call["function"]["name"], "arguments": ""}
            await send(chunk(i, "", None, res, calls=[head]))
            args = {"index": k, "function": {"arguments": call["function"]["arguments"]}}
            await send(chunk(i, "", None, res, calls=[args]))

    async def run(i: int, body: dict):
        first = [True]
        # With tools, text that may be a call is held back until the answer is whole (serving.protocol.tool_calls).
        split = tc.StreamSplitter(spec.tools, spec.prefill) if spec.tools is not None and spec.tools.active else None

        async def on_chunk(delta: str, res: engine.EngineResult) -> None:
            now = time.monotonic()
            if first[0]:
                parts.metrics.ttft.labels(request.path).observe(now - t0)
            elif last_chunk[0] is not None:
                parts.metrics.itl.labels(request.path).observe(now - last_chunk[0])
            last_chunk[0] = now
            if split is not None:
                delta = split.feed(delta)
            if delta or first[0]:
                await send(chunk(i, delta, None, res, first[0]))
            first[0] = False

        res, replica_id, timing = await parts.dispatcher.run_choice(body, True, on_chunk, tenant=tenant.id)
        fr = finish_reason(res.finish)
        if split is not None:
            tail = split.feed(tc.trimmed_close(res.finish))
            rest, parsed = await split.finish_off_loop()
            rest = tail + rest
            turn.count_tools(parts, parsed, spec, tenant, cid, i, res, replica_id)
            turn.monitor_answer(parts, spec, tenant, res, replica_id, parsed.content, parsed.calls)
            if rest:
                await send(chunk(i, rest, None, res))
            await send_calls(i, res, parsed.calls)
            fr = "tool_calls" if parsed.calls else ("stop" if parsed.outcome != "none" and fr != "length" else fr)
            if spec.session is not None:
                turn.remember_choice(parts, tenant, spec, cid, i, parsed.content, parsed.calls)
        else:
            turn.monitor_answer(parts, spec, tenant, res, replica_id, res.text, [])
            if spec.session is not None:
                turn.remember_choice(parts, tenant, spec, cid, i, res.text, [])
        await send(chunk(i, "", fr, res))
        durable.append(parts.dispatcher.log_completion(tenant, spec, cid, i, prompt_ids, res, replica_id, timing))
        return res

    tasks = [asyncio.ensure_future(run(i, b)) for i, b in enumerate(bodies)]
    try:
        try:
            results = await asyncio.gather(*tasks)
        finally:  # one choice failed or the client left: the others stop too (and abort on their replicas)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await parts.sink.wait(durable, ev.TOPIC_COMPLETIONS)  # before [DONE]: the client's sign it is whole
        if spec.include_usage:
            completion_tokens = sum(len(r.output_ids) for r in results)
            counts = usage(len(prompt_ids), completion_tokens, results[0].cached_tokens)
            await send(
                {"id": cid, "object": obj, "created": created, "model": spec.model, "choices": [], "usage": counts}
            )
        await send(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ClientGone:
        parts.metrics.cancels.labels(request.path).inc()
        return resp
    except ApiError as e:
        if not started[0]:
            raise  # nothing sent yet: a normal error response
        try:
            await send(e.body())
            await send(b"data: [DONE]\n\n")
        except ClientGone:
            parts.metrics.cancels.labels(request.path).inc()
        return resp
    parts.metrics.e2e.labels(request.path).observe(time.monotonic() - t0)
    return resp
