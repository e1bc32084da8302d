"""The OpenAI API: `/v1/completions`, `/v1/chat/completions` (plain, or streamed as server-sent events)
and `/v1/models`.

    body --schema (serving.protocol.openai)--> GenerationSpec --prompter--> token ids, sampling
         --dispatcher, one per choice--> EngineResult --> OpenAI response (+ completion id, model version)
                                                     '--> completion event (on disk before the answer)

Agent turns (tools offered, or a conversation) are linked into sessions (serving.signals.sessions); a tool call
the model writes becomes OpenAI `tool_calls` (serving.protocol.tool_calls).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from aiohttp import web

from contracts import events as ev
from serving.api import turn
from serving.api.respond import SESSION_HEADER, VERSION_HEADER, fingerprint, json_response
from serving.api.stream import stream_choices
from serving.auth import TENANT, Tenant
from serving.protocol import tool_calls as tc, tool_schema
from serving.protocol.openai import (
    GenerationSpec,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    parse_chat,
    parse_completion,
    usage,
)
from serving.protocol.schema import parse_json_body
from serving.replica import engine

if TYPE_CHECKING:
    from serving.api.turn import TurnParts


class CompletionsApi:
    def __init__(self, parts: TurnParts):
        self.parts = parts

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/completions", self.completions),
            web.post("/chat/completions", self.chat_completions),
            web.get("/models", self.models),
        ]

    def body(self, raw: bytes) -> dict:
        return parse_json_body(raw, self.parts.limits.max_json_depth)

    async def models(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "object": "list",
                "data": [{"id": self.parts.model_name, "object": "model", "created": 0, "owned_by": "flywheel"}],
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        spec = parse_completion(self.body(await request.read()), self.parts.limits)
        return await self.generate(request, request[TENANT], spec)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        tenant: Tenant = request[TENANT]
        body, limits = self.body(await request.read()), self.parts.limits
        spec = await tool_schema.read_off_loop(body, lambda: parse_chat(body, limits), limits.tool_schema_timeout_s)
        spec.session_hint = turn.session_hint(
            self.parts, tenant, request.headers.get(SESSION_HEADER) or spec.session_hint
        )
        return await self.generate(request, tenant, spec)

    async def generate(self, request: web.Request, tenant: Tenant, spec: GenerationSpec) -> web.StreamResponse:
        parts = self.parts
        prompt_ids = await parts.prompter.prompt_ids(spec)
        cid = parts.ids.issue(tenant)
        created = int(time.time())
        if spec.kind == "chat":
            turn.link_session(parts, tenant, spec, cid)
        sampling = parts.prompter.sampling(spec)
        top_n = spec.logprobs or 0
        bodies = [engine.payload(prompt_ids, sampling, top_n, spec.stream, f"{cid}-{i}") for i in range(spec.n)]
        if spec.stream:
            return await stream_choices(parts, request, tenant, spec, cid, prompt_ids, bodies, created)
        t0 = time.monotonic()
        results = await asyncio.gather(*(parts.dispatcher.run_choice(b, False, tenant=tenant.id) for b in bodies))
        choices = []
        durable = []
        for i, (res, replica_id, timing) in enumerate(results):
            durable.append(parts.dispatcher.log_completion(tenant, spec, cid, i, prompt_ids, res, replica_id, timing))
            choices.append(await self.choice(spec, i, res, tenant, cid, replica_id))
            if spec.session is not None:
                m = choices[-1]["message"]
                turn.remember_choice(parts, tenant, spec, cid, i, m["content"], m.get("tool_calls", []))
        await parts.sink.wait(durable, ev.TOPIC_COMPLETIONS)
        version = results[0][0].weight_version
        completion_tokens = sum(len(r.output_ids) for r, _, _ in results)
        body = {
            "id": cid,
            "object": "text_completion" if spec.kind == "completion" else "chat.completion",
            "created": created,
            "model": spec.model,
            "choices": choices,
            "model_version": version,
            "system_fingerprint": fingerprint(version),
            "usage": usage(len(prompt_ids), completion_tokens, results[0][0].cached_tokens),
        }
        headers = {VERSION_HEADER: "" if version is None else str(version)}
        if spec.session is not None:
            body["session_id"] = headers[SESSION_HEADER] = spec.session.session_id
        parts.metrics.e2e.labels(request.path).observe(time.monotonic() - t0)
        return json_response(body, headers=headers)

    def logprobs(self, spec: GenerationSpec, res: engine.EngineResult) -> dict | None:
        if spec.logprobs is None:
            return None
        tok = self.parts.prompter.tok
        tokens = self.parts.prompter.token_strings(res.output_ids)
        tops = None
        if spec.logprobs and res.top_logprobs:
            tops = [
                {tok.decode([tid], skip_special_tokens=False): lp for tid, lp in row.items()}
                for row in res.top_logprobs
            ]
        if spec.kind == "completion":
            return completion_logprobs(tokens, res.logprobs, tops, len(spec.prompt))
        return chat_logprobs(tokens, res.logprobs, tops)

    async def choice(
        self, spec: GenerationSpec, i: int, res: engine.EngineResult, tenant: Tenant, cid: str, replica_id: str
    ) -> dict:
        fr = finish_reason(res.finish)
        if spec.kind == "completion":
            turn.monitor_answer(self.parts, spec, tenant, res, replica_id, res.text, [])
            return {"index": i, "text": res.text, "logprobs": self.logprobs(spec, res), "finish_reason": fr}
        message: dict[str, object] = {"role": "assistant", "content": res.text}
        if spec.tools is not None and spec.tools.active:
            parsed = await tc.parse_off_loop(spec.prefill + res.text + tc.trimmed_close(res.finish), spec.tools)
            turn.count_tools(self.parts, parsed, spec, tenant, cid, i, res, replica_id)
            turn.monitor_answer(self.parts, spec, tenant, res, replica_id, parsed.content, parsed.calls)
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"], fr = parsed.calls, "tool_calls"
            elif parsed.outcome != "none" and fr != "length":
                fr = "stop"  # a call the model got wrong comes back as its text (a cut-off one says length)
        else:
            turn.monitor_answer(self.parts, spec, tenant, res, replica_id, res.text, [])
        return {"index": i, "message": message, "logprobs": self.logprobs(spec, res), "finish_reason": fr}
