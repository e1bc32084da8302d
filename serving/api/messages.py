"""Anthropic's Messages API: `POST /v1/messages` (plain, or streamed as its events) and
`POST /v1/messages/count_tokens`, keyed by `x-api-key` (or a bearer token) with an `anthropic-version`
header, and every error in that API's shape (`{"type": "error", "error": {"type", "message"}}`).

A message's id is `msg_` + its completion id (signed, serving.auth): `/v1/feedback` takes either. The turn
itself runs through serving.api.turn, like every conversation; the shapes are serving.protocol.messages.

Streamed, nothing is sent before the first token (an error before then is a normal error response); then
`message_start` and a `ping`, a text block's deltas as they come, each tool_use block (its input as one
`input_json_delta`) once the answer is whole, `message_delta` (stop reason, output tokens) and
`message_stop` once the completion event is on disk. An error after the start is an `error` event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from serving.api import turn as turns
from serving.api.respond import SESSION_HEADER, VERSION_HEADER, json_response, send_event
from serving.api.responses import count_ignored
from serving.auth import TENANT
from serving.protocol import messages as ma, tool_schema
from serving.protocol.schema import ApiError, parse_json_body
from serving.routing.dispatcher import ClientGone

if TYPE_CHECKING:
    from serving.api.turn import TurnParts

PATH = "/v1/messages"
log = logging.getLogger(__name__)


@web.middleware
async def anthropic_errors(request: web.Request, handler):
    """Errors on /v1/messages in Anthropic's shape (the rest of /v1 keeps OpenAI's)."""
    if not request.path.startswith(PATH):
        return await handler(request)
    try:
        return await handler(request)
    except ApiError as e:
        log.debug("%s %s: %d %s", request.method, request.path, e.status, e.message)
        return json_response(ma.error_body(e.status, e.message), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return json_response(ma.error_body(e.status, e.reason or "error"), status=e.status)
    except Exception:  # the gateway's own fault: logged, and in this API's shape too
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_response(ma.error_body(500, "internal error"), status=500)


def check_version(request: web.Request) -> None:
    v = request.headers.get("anthropic-version")
    if v is None:
        raise ApiError(400, "anthropic-version: header is required")
    if not ma.VERSION.match(v):
        raise ApiError(400, f"anthropic-version: {v[:40]!r} is not a valid version (a date, e.g. 2023-06-01)")


class MessagesApi:
    def __init__(self, parts: TurnParts):
        self.parts = parts

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/messages", self.create), web.post("/messages/count_tokens", self.count_tokens)]

    async def count_tokens(self, request: web.Request) -> web.Response:
        check_version(request)
        limits = self.parts.limits
        body = parse_json_body(await request.read(), limits.max_json_depth)
        req = await tool_schema.read_off_loop(
            body, lambda: ma.read_request(body, limits, counting=True), limits.tool_schema_timeout_s
        )
        count_ignored(self.parts.metrics, "messages", req.ignored)
        spec = ma.to_spec(req, self.parts.limits, self.parts.model_name)
        spec.max_tokens = 1  # counted as a request would be, refused as one would be when it does not fit
        return json_response({"input_tokens": len(await self.parts.prompter.prompt_ids(spec))})

    async def create(self, request: web.Request) -> web.StreamResponse:
        parts, tenant = self.parts, request[TENANT]
        check_version(request)
        body, limits = parse_json_body(await request.read(), parts.limits.max_json_depth), parts.limits
        req = await tool_schema.read_off_loop(body, lambda: ma.read_request(body, limits), limits.tool_schema_timeout_s)
        count_ignored(parts.metrics, "messages", req.ignored)
        spec = ma.to_spec(req, parts.limits, parts.model_name)
        spec.session_hint = turns.session_hint(parts, tenant, request.headers.get(SESSION_HEADER))
        cid = parts.ids.issue(tenant)
        mid = "msg_" + cid
        if spec.stream:
            return await self._stream(request, tenant, spec, cid, mid)
        turn = await turns.run_turn(parts, PATH, tenant, spec, cid, id_prefix="toolu_")
        headers = {VERSION_HEADER: "" if turn.version is None else str(turn.version)}
        if spec.session is not None:
            headers[SESSION_HEADER] = spec.session.session_id
        return json_response(ma.message_body(mid, spec, turn), headers=headers)

    async def _stream(self, request, tenant, spec, cid, mid) -> web.StreamResponse:
        parts = self.parts
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        state = {"text_open": False, "index": 0}

        async def send(kind: str, **fields) -> None:
            try:
                await send_event(
                    request, resp, kind, {"type": kind, **fields}, parts.dispatcher.pool_version, spec.session
                )
            except ConnectionResetError:
                raise ClientGone() from None

        async def on_text(delta: str, first: bool) -> None:
            if first:
                message = {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": spec.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": ma.usage(spec.prompt_tokens, 1),
                }
                await send("message_start", message=message)
                await send("ping")
            if delta:
                if not state["text_open"]:
                    block = {"type": "text", "text": ""}
                    await send("content_block_start", index=state["index"], content_block=block)
                    state["text_open"] = True
                await send("content_block_delta", index=state["index"], delta={"type": "text_delta", "text": delta})

        try:
            turn = await turns.run_turn(parts, PATH, tenant, spec, cid, on_text, id_prefix="toolu_")
            if state["text_open"]:
                await send("content_block_stop", index=state["index"])
                state["index"] += 1
            for block in ma.content_blocks(turn):
                if block["type"] != "tool_use":
                    continue
                i = state["index"]
                await send("content_block_start", index=i, content_block={**block, "input": {}})
                partial = orjson.dumps(block["input"]).decode()
                await send("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": partial})
                await send("content_block_stop", index=i)
                state["index"] += 1
            reason, seq = ma.stop_of(turn, spec)
            usage = ma.usage(turn)
            await send("message_delta", delta={"stop_reason": reason, "stop_sequence": seq}, usage=usage)
            await send("message_stop")
            await resp.write_eof()
        except ClientGone:
            parts.metrics.cancels.labels(PATH).inc()
        except ApiError as e:
            if not resp.prepared:
                raise  # nothing sent yet: a normal error response
            try:
                await send("error", error=ma.error_body(e.status, e.message)["error"])
            except ClientGone:
                parts.metrics.cancels.labels(PATH).inc()
        return resp
