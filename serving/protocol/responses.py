"""OpenAI's Responses API (`POST /v1/responses`, what Codex CLI speaks): the request read into the gateway's
conversation (serving.protocol.openai's checked messages), and the response and its stream events written back.

Parts are checked against the official `openai` SDK's request types (serving.protocol.typed_bodies), item by item
and tool by tool, so that an error names the item. What maps where:

    instructions                         a system message first (not carried by previous_response_id)
    input: string | message items        user / system (developer) / assistant messages
    function_call, custom_tool_call      the assistant's calls (a custom tool's text is {"input": text})
    function_call_output, custom_...     tool results
    reasoning                            skipped: this model writes none, a client may send another's back
    previous_response_id                 the stored conversation of that response (serving.response_store)
    tools: function, custom              the model's tools (serving.protocol.tool_calls); hosted ones (web_search,
                                         ...) are left out and counted: nothing here would run them

Fields newer than the pinned SDK's types are ignored and counted (flywheel_gateway_ignored_fields_total):
agent clients move faster than any pin. Fields this server cannot honour are refused unless neutral.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from openai.types.responses import response_create_params as rcp
from openai.types.responses.easy_input_message_param import EasyInputMessageParam
from openai.types.responses.response_custom_tool_call_output_param import ResponseCustomToolCallOutputParam
from openai.types.responses.response_custom_tool_call_param import ResponseCustomToolCallParam
from openai.types.responses.response_function_tool_call_param import ResponseFunctionToolCallParam
from openai.types.responses.response_input_item_param import FunctionCallOutput
from openai.types.responses.response_output_message_param import ResponseOutputMessageParam
from openai.types.responses.tool_param import CustomToolParam, FunctionToolParam

from serving.protocol import tool_calls as tc
from serving.protocol.limits import Limits
from serving.protocol.openai import GenerationSpec, render_chat
from serving.protocol.schema import ApiError, at_most
from serving.protocol.typed_bodies import check

KNOWN = set(rcp.ResponseCreateParamsBase.__annotations__) | {"stream"}
# Accepted and not checked, as they mean nothing here (docs/agent-clients.md): caching is automatic and per tenant,
# there is
# no service tier, reasoning or hosted tool to configure, the answer has no logprobs to include, and the
# text's verbosity is the model's own. Checking them against the pinned SDK's types would only refuse
# values newer clients send (Claude Code's thinking modes did exactly that on the Messages API).
IGNORED = {
    "include",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "stream_options",
    "max_tool_calls",
    "text",
}
# Refused unless neutral: what the client asks for would not happen.
UNSUPPORTED = {"background": False, "conversation": None, "prompt": None, "top_logprobs": 0}
TEXT_FORMAT = {"type": "text"}


@dataclass
class ResponsesRequest:
    body: dict  # the checked top-level fields
    messages: list[dict]  # this request's own input, as checked messages (no instructions)
    items: list[dict]  # the input items as given (with ids), for GET .../input_items
    tools: tc.ToolSpec | None
    tools_given: list = field(default_factory=list)
    custom: set = field(default_factory=set)  # names of custom (free-text) tools
    ignored: list = field(default_factory=list)  # top-level fields this server does not know

    @property
    def previous_id(self) -> str | None:
        return self.body.get("previous_response_id")

    @property
    def store(self) -> bool:
        return self.body.get("store", True) is not False


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content, where: str, out_ok: bool) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type")
        if kind == "input_text" or (out_ok and kind == "output_text"):
            parts.append(p["text"])
        elif kind == "refusal":
            parts.append(p.get("refusal", ""))
        else:
            raise ApiError(
                400,
                f"{where}[{j}]: content of type {kind!r} is not supported (this model reads text only)",
                param=f"{where}[{j}].type",
                code="unsupported_parameter",
            )
    return "".join(parts)


def _call(messages: list[dict], call: dict) -> None:
    """A call joins the assistant message it follows, or starts one."""
    if messages and messages[-1]["role"] == "assistant" and not any(m["role"] == "tool" for m in messages[-1:]):
        messages[-1]["calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": "", "calls": [call]})


def read_items(raw, where: str = "input", limits: Limits | None = None) -> tuple[list[dict], list[dict]]:
    """(checked messages, the items as given with an id each) of `input`."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}], [_item_of_text(raw)]
    if not isinstance(raw, list):
        raise ApiError(400, f"'{where}' must be a string or a list of items", param=where, code="invalid_type")
    limits = limits or Limits()
    at_most(len(raw), limits.max_messages, f"'{where}': items", "max_messages", where)  # before any is checked
    parts = sum(
        len(x[k]) for x in raw if isinstance(x, dict) for k in ("content", "output") if isinstance(x.get(k), list)
    )
    at_most(parts, limits.max_content_parts, f"'{where}': content parts", "max_content_parts", where)
    messages: list[dict] = []
    items: list[dict] = []
    for i, item in enumerate(raw):
        p = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{p} must be an object", param=p, code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            m = check(ResponseOutputMessageParam if "id" in item else EasyInputMessageParam, item, p)
            messages.append({"role": "assistant", "content": _text_of(m["content"], f"{p}.content", True), "calls": []})
        elif kind == "message":
            m = check(EasyInputMessageParam, item, p)
            role = "system" if m["role"] == "developer" else m["role"]  # the model knows one kind of instructions
            messages.append({"role": role, "content": _text_of(m["content"], f"{p}.content", False)})
        elif kind == "function_call":
            c = check(ResponseFunctionToolCallParam, item, p)
            _call(messages, {"id": c["call_id"], "name": c["name"], "arguments": c["arguments"]})
        elif kind == "custom_tool_call":
            c = check(ResponseCustomToolCallParam, item, p)
            _call(messages, {"id": c["call_id"], "name": c["name"], "arguments": json.dumps({"input": c["input"]})})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            o = check(
                FunctionCallOutput if kind == "function_call_output" else ResponseCustomToolCallOutputParam, item, p
            )
            text = _text_of(o["output"], f"{p}.output", True)
            messages.append({"role": "tool", "content": text, "tool_call_id": o["call_id"]})
        elif kind == "reasoning":
            pass  # another model's thoughts (or an encrypted blob): nothing this one can read
        else:
            raise ApiError(
                400,
                f"{p}: input items of type {kind!r} are not supported (send messages, function calls and their "
                "outputs)",
                param=f"{p}.type",
                code="unsupported_parameter",
            )
        items.append({"id": item.get("id") or new_id("msg" if kind == "message" else "item"), **item})
    return messages, items


def _item_of_text(text: str) -> dict:
    content = [{"type": "input_text", "text": text}]
    return {"id": new_id("msg"), "type": "message", "role": "user", "content": content}


def _tools(body: dict, dropped: list[str], limits: Limits) -> tuple[tc.ToolSpec | None, set]:
    """The request's tools as the chat API's (so one set of checks serves both), and the custom ones' names.
    Tools the server would have to run itself (web_search, file_search, code_interpreter, ...) or that
    group others (namespace, tool_search) are not offered to the model: left out, named in `dropped`. A custom
    tool's grammar is not enforced (no grammar backend here): the client's own parser judges the input."""
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ApiError(400, "'tools' must be a list", param="tools", code="invalid_type")
    at_most(len(raw), tc.MAX_TOOLS, "'tools'", "MAX_TOOLS", "tools")  # before each is checked
    chat_tools, custom = [], set()
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            f = check(FunctionToolParam, t, p, nullable=("parameters", "strict"))  # the API defaults them
            fn = {"name": f["name"], "description": f.get("description") or "", "parameters": f.get("parameters")}
            chat_tools.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
        elif kind == "custom":
            f = check(CustomToolParam, t, p)
            if (f.get("format") or TEXT_FORMAT).get("type") != "text":
                dropped.append("custom_tool_grammar")
            custom.add(f["name"])
            params = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            chat_tools.append(
                {
                    "type": "function",
                    "function": {"name": f["name"], "description": f.get("description", ""), "parameters": params},
                }
            )
        elif isinstance(kind, str):
            dropped.append("tool_" + "".join(c if c.isalnum() else "_" for c in kind.lower())[:30])
        else:
            raise ApiError(400, f"{p} must be an object with a 'type'", param=f"{p}.type", code="invalid_value")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") not in ("function", "custom") or not isinstance(choice.get("name"), str):
            raise ApiError(
                400,
                "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                param="tool_choice",
                code="invalid_value",
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    spec = tc.parse_tools(
        {"tools": chat_tools, "tool_choice": choice, "parallel_tool_calls": body.get("parallel_tool_calls")}, limits
    )
    return spec, custom


def read_request(body: dict, limits: Limits | None = None) -> ResponsesRequest:
    limits = limits or Limits()
    top = {k: v for k, v in body.items() if k in KNOWN and k not in ("input", "tools") and k not in IGNORED}
    checked = check(rcp.ResponseCreateParamsBase, {**top, "input": "", "model": body.get("model")}, "")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
    checked["stream"] = bool(body.get("stream", False))
    for name, neutral in UNSUPPORTED.items():
        if body.get(name) not in (None, neutral):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    text = body.get("text") or {}
    fmt = (text.get("format") if isinstance(text, dict) else None) or TEXT_FORMAT
    if not isinstance(fmt, dict) or fmt.get("type") != "text":
        raise ApiError(
            400,
            "only text output is supported: the engine runs without a grammar backend, so JSON could not be guaranteed",
            param="text.format",
            code="unsupported_parameter",
        )
    if checked.get("truncation") == "auto":
        raise ApiError(
            400,
            "truncation 'auto' is not supported: a conversation longer than the context is refused, never cut",
            param="truncation",
            code="unsupported_parameter",
        )
    if "input" not in body and not checked.get("previous_response_id"):
        raise ApiError(400, "'input' is required", param="input", code="missing_required_parameter")
    messages, items = read_items(body.get("input", []), "input", limits)
    ignored = sorted(set(body) - KNOWN)
    tools, custom = _tools(body, ignored, limits)
    return ResponsesRequest(checked, messages, items, tools, list(body.get("tools") or []), custom, ignored)


def to_spec(req: ResponsesRequest, previous: list[dict], limits: Limits, model: str) -> GenerationSpec:
    """The turn to generate: the instructions, the stored conversation, this input; tool results checked
    against the calls made before them."""
    b = req.body
    conversation = previous + req.messages
    # a chain of previous_response_id grows by each turn: bounded like one request's input
    at_most(len(conversation), limits.max_messages, "messages in the conversation", "max_messages", "input")
    instructions = b.get("instructions")
    head = [{"role": "system", "content": instructions}] if instructions else []
    calls = set()
    for m in conversation:
        calls |= {c["id"] for c in m.get("calls", [])}
        if m["role"] == "tool" and m["tool_call_id"] not in calls:
            raise ApiError(
                400,
                f"no tool call found for function call output with call_id {m['tool_call_id'][:80]!r}",
                param="input",
                code="invalid_value",
            )
    if not any(m["content"].strip() or m.get("calls") for m in head + conversation):
        raise ApiError(400, "'input' contains no text", param="input", code="empty_prompt")
    messages = head + conversation
    prefill = req.tools.opening() if req.tools is not None and req.tools.active else ""
    meta = b.get("metadata") or {}
    return GenerationSpec(
        kind="chat",
        api="responses",
        clamp=True,
        model=b.get("model") or model,
        prompt=render_chat(messages, req.tools) + prefill,
        max_tokens=b.get("max_output_tokens") or limits.max_tokens,
        temperature=1.0 if b.get("temperature") is None else b["temperature"],
        top_p=1.0 if b.get("top_p") is None else b["top_p"],
        stream=b["stream"],
        tools=req.tools,
        prefill=prefill,
        messages=messages,
        session_hint=meta.get("session_id"),
        user=b.get("user"),
    )


def check_sampling(b: dict) -> None:
    t, p, m = b.get("temperature"), b.get("top_p"), b.get("max_output_tokens")
    if t is not None and not 0 <= t <= 2:
        raise ApiError(400, "'temperature' must be between 0 and 2", param="temperature", code="out_of_range")
    if p is not None and not 0 < p <= 1:
        raise ApiError(400, "'top_p' must be in (0, 1]", param="top_p", code="out_of_range")
    if m is not None and m < 1:
        raise ApiError(400, "'max_output_tokens' must be at least 1", param="max_output_tokens", code="out_of_range")
    meta = b.get("metadata")
    if meta is not None and (
        len(meta) > 16 or any(len(k) > 64 or not isinstance(v, str) or len(v) > 512 for k, v in meta.items())
    ):
        raise ApiError(
            400,
            "'metadata' must be at most 16 string pairs (keys up to 64 chars, values up to 512)",
            param="metadata",
            code="invalid_value",
        )


# ----------------------------------------------------------------------------- what goes back


def output_items(turn, custom: set) -> list[dict]:
    """The answer as output items: a message (its text), then a function_call (or custom_tool_call) per call."""
    out = []
    if turn.content or not turn.calls:
        text = {"type": "output_text", "text": turn.content, "annotations": [], "logprobs": []}
        status = "incomplete" if turn.finish == "length" else "completed"
        out.append({"id": new_id("msg"), "type": "message", "role": "assistant", "status": status, "content": [text]})
    for c in turn.calls:
        if c["name"] in custom:
            item = {"type": "custom_tool_call", "call_id": c["id"], "name": c["name"]}
            item["input"] = json.loads(c["arguments"]).get("input", "")
            out.append({"id": new_id("ctc"), **item})
        else:
            item = {"type": "function_call", "call_id": c["id"], "name": c["name"], "arguments": c["arguments"]}
            out.append({"id": new_id("fc"), **item, "status": "completed"})
    return out


def as_message(turn) -> dict:
    """The answer as the conversation remembers it (what previous_response_id brings back)."""
    return {"role": "assistant", "content": turn.content, "calls": list(turn.calls)}


def response_body(rid: str, req: ResponsesRequest, spec: GenerationSpec, status: str, output, turn=None) -> dict:
    b = req.body
    body = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": b.get("instructions"),
        "max_output_tokens": b.get("max_output_tokens"),
        "metadata": b.get("metadata") or {},
        "model": spec.model,
        "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
        "previous_response_id": req.previous_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store,
        "temperature": spec.temperature,
        "text": {"format": TEXT_FORMAT},
        "tool_choice": b.get("tool_choice") or "auto",
        "tools": req.tools_given,
        "top_p": spec.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": b.get("user"),
    }
    if turn is not None:
        if turn.finish == "length":
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        cached = turn.res.cached_tokens or 0
        body["usage"] = {
            "input_tokens": turn.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": turn.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
        }
        body["completion_id"], body["model_version"] = turn.cid, turn.version
        body["session_id"] = spec.session.session_id if spec.session is not None else None
    return body
