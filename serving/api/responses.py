"""OpenAI's Responses API: `POST /v1/responses` (plain, or streamed as its typed events), and what `store`
keeps: `GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `DELETE /v1/responses/{id}`.

A response's id is `resp_` + its completion id (signed, serving.auth): `/v1/feedback` takes either. The
turn itself runs through serving.api.turn, like every conversation; the shapes are serving.protocol.responses.

Streamed, nothing is sent before the first token (an error before then is a normal error response); then
`response.created` and `response.in_progress`, the message item's text deltas as they come, each call as an
item of its own once the answer is whole, and `response.completed` (`response.incomplete` when cut off by
max_output_tokens) once the completion event is on disk. An error after the start is an `error` event and
`response.failed`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from serving.api import turn as turns
from serving.api.respond import SESSION_HEADER, VERSION_HEADER, json_response, send_event
from serving.auth import TENANT, Tenant
from serving.protocol import responses as ra, tool_schema
from serving.protocol.schema import ApiError, parse_json_body
from serving.routing.dispatcher import ClientGone

if TYPE_CHECKING:
    from serving.api.turn import TurnParts
    from serving.metrics import GatewayMetrics
    from serving.response_store import ResponseStore

PATH = "/v1/responses"
_FIELD = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


MAX_FIELD_LABELS = 32  # per API: a client making up names costs "other", never a series each


def count_ignored(metrics: GatewayMetrics, api: str, names: list[str]) -> None:
    """Fields ignored, by name: the first MAX_FIELD_LABELS plausible names each; any other name as 'other'."""
    seen = metrics.ignored_names.setdefault(api, set())
    for name in names:
        if name not in seen and _FIELD.match(name) and len(seen) < MAX_FIELD_LABELS:
            seen.add(name)
        metrics.ignored_fields.labels(api, name if name in seen else "other").inc()


class ResponsesApi:
    def __init__(self, parts: TurnParts, responses: ResponseStore):
        self.parts, self.responses = parts, responses

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/responses", self.create),
            web.get("/responses/{id}", self.get),
            web.delete("/responses/{id}", self.delete),
            web.get("/responses/{id}/input_items", self.input_items),
        ]

    async def _record(self, tenant: Tenant, rid: str, param: str = "response_id") -> dict:
        rec = await self.responses.run(self.responses.get, tenant.id, rid) if len(rid) <= 256 else None
        if rec is None:
            raise ApiError(404, f"Response with id {rid[:80]!r} not found.", param=param, code="response_not_found")
        return rec

    async def get(self, request: web.Request) -> web.Response:
        if request.query.get("stream") in ("true", "1"):
            raise ApiError(400, "a stored response cannot be streamed again", param="stream")
        return json_response((await self._record(request[TENANT], request.match_info["id"]))["response"])

    async def delete(self, request: web.Request) -> web.Response:
        rid, tenant = request.match_info["id"], request[TENANT]
        if not await self.responses.run(self.responses.delete, tenant.id, rid[:256]):
            raise ApiError(404, f"Response with id {rid[:80]!r} not found.", param="response_id", code="not_found")
        return json_response({"id": rid, "object": "response", "deleted": True})

    async def input_items(self, request: web.Request) -> web.Response:
        items = (await self._record(request[TENANT], request.match_info["id"]))["items"]
        order = request.query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "'order' must be asc or desc", param="order", code="invalid_value")
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise ApiError(400, "'limit' must be an integer in [1, 100]", param="limit", code="invalid_value")
        items = items if order == "asc" else items[::-1]
        after = request.query.get("after")
        if after is not None:
            ids = [i["id"] for i in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    async def create(self, request: web.Request) -> web.StreamResponse:
        parts, tenant = self.parts, request[TENANT]
        body, limits = parse_json_body(await request.read(), parts.limits.max_json_depth), parts.limits
        req = await tool_schema.read_off_loop(body, lambda: ra.read_request(body, limits), limits.tool_schema_timeout_s)
        ra.check_sampling(req.body)
        count_ignored(parts.metrics, "responses", req.ignored)
        previous: list[dict] = []
        if req.previous_id:
            previous = (await self._record(tenant, req.previous_id, "previous_response_id"))["conversation"]
        spec = ra.to_spec(req, previous, parts.limits, parts.model_name)
        spec.session_hint = turns.session_hint(parts, tenant, request.headers.get(SESSION_HEADER) or spec.session_hint)
        cid = parts.ids.issue(tenant)
        rid = "resp_" + cid
        if spec.stream:
            return await self._stream(request, tenant, req, spec, cid, rid, previous)
        turn = await turns.run_turn(parts, PATH, tenant, spec, cid)
        body = ra.response_body(rid, req, spec, "completed", ra.output_items(turn, req.custom), turn)
        await self._store(tenant, rid, req, previous, turn, body)
        headers = {VERSION_HEADER: "" if turn.version is None else str(turn.version)}
        if spec.session is not None:
            headers[SESSION_HEADER] = spec.session.session_id
        return json_response(body, headers=headers)

    async def _store(self, tenant: Tenant, rid: str, req: ra.ResponsesRequest, previous, turn, body: dict) -> None:
        if not req.store:
            return
        record = {
            "response": body,
            "conversation": previous + req.messages + [ra.as_message(turn)],
            "items": req.items,
        }
        await self.responses.run(self.responses.put, tenant.id, rid, record)

    async def _stream(self, request, tenant, req, spec, cid, rid, previous) -> web.StreamResponse:
        parts = self.parts
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", VERSION_HEADER: ""}
        )
        seq = [0]
        state: dict[str, Any] = {"msg": None, "text": ""}

        async def send(kind: str, **fields) -> None:
            payload = {"type": kind, "sequence_number": seq[0], **fields}
            seq[0] += 1
            try:
                await send_event(request, resp, kind, payload, parts.dispatcher.pool_version, spec.session)
            except ConnectionResetError:
                raise ClientGone() from None

        def message_item(status: str) -> dict:
            text = {"type": "output_text", "text": state["text"], "annotations": [], "logprobs": []}
            content = [text] if status != "in_progress" else []
            return {"id": state["msg"], "type": "message", "role": "assistant", "status": status, "content": content}

        async def open_message() -> None:
            state["msg"] = ra.new_id("msg")
            await send("response.output_item.added", output_index=0, item=message_item("in_progress"))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            await send("response.content_part.added", item_id=state["msg"], output_index=0, content_index=0, part=part)

        async def on_text(delta: str, first: bool) -> None:
            if first:
                body = ra.response_body(rid, req, spec, "in_progress", [])
                await send("response.created", response=body)
                await send("response.in_progress", response=body)
            if delta:
                if state["msg"] is None:
                    await open_message()
                state["text"] += delta
                ids = {"item_id": state["msg"], "output_index": 0, "content_index": 0}
                await send("response.output_text.delta", **ids, delta=delta, logprobs=[])

        try:
            turn = await turns.run_turn(parts, PATH, tenant, spec, cid, on_text)
            items = ra.output_items(turn, req.custom)
            if items and items[0]["type"] == "message":
                if state["msg"] is None:
                    await open_message()
                items[0]["id"] = state["msg"]
                ids = {"item_id": state["msg"], "output_index": 0, "content_index": 0}
                part = items[0]["content"][0]
                await send("response.output_text.done", **ids, text=state["text"], logprobs=[])
                await send("response.content_part.done", **ids, part=part)
                await send("response.output_item.done", output_index=0, item=items[0])
            for k, item in enumerate(items):
                if item["type"] == "message":
                    continue
                await self._send_call(send, k, item)
            body = ra.response_body(rid, req, spec, "completed", items, turn)
            await self._store(tenant, rid, req, previous, turn, body)
            await send("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
            await resp.write_eof()
        except ClientGone:
            parts.metrics.cancels.labels(PATH).inc()
            return resp
        except ApiError as e:
            if not resp.prepared:
                raise  # nothing sent yet: a normal error response
            try:
                await send("error", code=e.code, message=e.message, param=e.param)
                failed = ra.response_body(rid, req, spec, "failed", [])
                failed["error"] = {"code": e.code or "server_error", "message": e.message}
                await send("response.failed", response=failed)
            except ClientGone:
                parts.metrics.cancels.labels(PATH).inc()
            return resp
        return resp

    @staticmethod
    async def _send_call(send, k: int, item: dict) -> None:
        """A call as the Responses stream has it: the item added, its arguments (or a custom tool's input) in
        one delta, done, the item done."""
        ids = {"item_id": item["id"], "output_index": k}
        if item["type"] == "custom_tool_call":
            await send("response.output_item.added", output_index=k, item={**item, "input": ""})
            await send("response.custom_tool_call_input.delta", **ids, delta=item["input"])
            await send("response.custom_tool_call_input.done", **ids, input=item["input"])
        else:
            await send(
                "response.output_item.added", output_index=k, item={**item, "arguments": "", "status": "in_progress"}
            )
            await send("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            await send("response.function_call_arguments.done", **ids, arguments=item["arguments"], name=item["name"])
        await send("response.output_item.done", output_index=k, item=item)
