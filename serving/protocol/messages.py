"""Anthropic's Messages API (`POST /v1/messages`, what Claude Code speaks): the request read into the
gateway's conversation (serving.protocol.openai's checked messages), and the message and its stream events
written back, with errors in that API's own shape.

Parts are checked against the official `anthropic` SDK's request types (serving.protocol.typed_bodies). What maps
where:

    system (a string or text blocks)       a system message first (and a system-role message where it is)
    user text, assistant text              user and assistant messages
    tool_use (assistant)                   the assistant's calls (input: the arguments object)
    tool_result (user)                     tool results, before the user's text of that message
    thinking, redacted_thinking            skipped: this model writes none
    tools (custom: name, input_schema)     the model's tools (serving.protocol.tool_calls); Anthropic's server tools
                                           (bash_..., web_search_..., ...) are refused
    tool_choice auto | any | tool | none   auto | required | that function | none
    max_tokens                             a ceiling: lowered to the server's limit and the context left

Images and documents are refused (the model reads text). A final assistant message (a prefill) is refused:
this model answers after a conversation, it does not continue a turn. Fields newer than the pinned SDK's
types are ignored and counted (flywheel_gateway_ignored_fields_total).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from anthropic.types import TextBlockParam, ToolParam, ToolResultBlockParam, ToolUseBlockParam
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsBase

from serving.protocol import tool_calls as tc
from serving.protocol.limits import Limits
from serving.protocol.openai import GenerationSpec, render_chat
from serving.protocol.schema import ApiError, at_most
from serving.protocol.typed_bodies import check

# anthropic-version is a date (2023-06-01 is the API's long-standing one; the SDK pinned here sends 2026-10-21):
# required, as the API requires it, and any date is taken, since the request types themselves are checked.
VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# The SDK pinned here no longer types the sampling fields (temperature, top_p, top_k); clients still send
# them, and they are honoured, checked here.
SAMPLING = {"temperature", "top_p", "top_k"}
KNOWN = set(MessageCreateParamsBase.__annotations__) | {"stream"} | SAMPLING
COUNT_KNOWN = set(MessageCountTokensParams.__annotations__)
# Accepted and not checked, as they mean nothing here (docs/agent-clients.md): the model does not think, caching is
# automatic and per tenant, there is no service tier, container, region or speed to pick. Checking them
# against the pinned SDK's types only refuses what newer clients send (Claude Code 2.1.332's `thinking`).
IGNORED = {
    "thinking",
    "context_management",
    "output_config",
    "service_tier",
    "container",
    "cache_control",
    "diagnostics",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
    "mcp_servers",
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# The SDK's MessageParam takes a system role inside messages too (Claude Code sends its environment so)
ROLES = ("user", "assistant", "system")


def error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


@dataclass
class MessagesRequest:
    body: dict  # the checked top-level fields
    messages: list[dict]  # checked messages (system first, if any)
    tools: tc.ToolSpec | None
    ignored: list = field(default_factory=list)


def _text(blocks, where: str) -> str:
    """A string, or text blocks (each checked) joined by line breaks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise ApiError(400, f"{where}: a string or a list of text blocks", param=where, code="invalid_type")
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind != "text":
            raise ApiError(
                400,
                f"{where}[{j}]: blocks of type {kind!r} are not supported here (text only)",
                param=f"{where}[{j}].type",
                code="unsupported_parameter",
            )
        parts.append(check(TextBlockParam, b, f"{where}[{j}]")["text"])
    return "\n".join(parts)


def _message(m, i: int) -> list[dict]:
    """One API message as the conversation's messages: tool results first, then the text (and calls). Each
    block is checked by its own type (a union's first match would hide what is wrong with it)."""
    p = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES or set(m) - {"role", "content"}:
        raise ApiError(
            400,
            f"{p}: a message is {{'role': 'user' | 'assistant' | 'system', 'content': ...}}",
            param=p,
            code="invalid_value",
        )
    role = m["role"]
    if not isinstance(m.get("content"), (str, list)):
        raise ApiError(400, f"{p}.content: a string or a list of blocks", param=f"{p}.content", code="invalid_type")
    if role == "system":  # mid-conversation instructions (Claude Code's environment), text only
        return [{"role": "system", "content": _text(m["content"], f"{p}.content")}]
    if isinstance(m["content"], str):
        return [{"role": role, "content": m["content"], **({"calls": []} if role == "assistant" else {})}]
    text, calls, results = [], [], []
    for j, raw in enumerate(m["content"]):
        q = f"{p}.content[{j}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "text":
            text.append(check(TextBlockParam, raw, q)["text"])
        elif kind == "tool_use" and role == "assistant":
            u = check(ToolUseBlockParam, raw, q)
            calls.append({"id": u["id"], "name": u["name"], "arguments": json.dumps(u["input"], ensure_ascii=False)})
        elif kind == "tool_result" and role == "user":
            r = check(ToolResultBlockParam, raw, q)
            content = _text(r.get("content", ""), f"{q}.content")
            result = {"role": "tool", "content": content, "tool_call_id": r["tool_use_id"]}
            if r.get("is_error"):  # the client's own verdict on the call (serving.signals.hacking)
                result["is_error"] = True
            results.append(result)
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # another model's thoughts: nothing this one can read
        else:
            raise ApiError(
                400,
                f"{q}: {kind!r} blocks are not supported in a {role} message (text, tool_use from the "
                "assistant, tool_result from the user)",
                param=f"{q}.type",
                code="unsupported_parameter",
            )
    out = list(results)
    if text or calls or not results:
        msg = {"role": role, "content": "\n".join(text)}
        out.append({**msg, "calls": calls} if role == "assistant" else msg)
    return out


def _tools(body: dict, limits: Limits) -> tc.ToolSpec | None:
    raw = body.get("tools") or []
    if not isinstance(raw, list):
        raise ApiError(400, "tools: must be a list", param="tools", code="invalid_type")
    at_most(len(raw), tc.MAX_TOOLS, "tools", "MAX_TOOLS", "tools")  # before each is checked
    chat = []
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        if isinstance(t, dict) and t.get("type") not in (None, "custom"):
            raise ApiError(
                400,
                f"{p}: server tools ({t.get('type')!r}) are not supported: this server runs no tools of its own",
                param=f"{p}.type",
                code="unsupported_parameter",
            )
        t = check(ToolParam, t, p)
        fn = {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}
        chat.append({"type": "function", "function": fn})
    choice, parallel = body.get("tool_choice"), True
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none") or not isinstance(
            choice.get("disable_parallel_tool_use", False), bool
        ):
            raise ApiError(
                400,
                "tool_choice: {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                param="tool_choice",
                code="invalid_value",
            )
        parallel = not choice.get("disable_parallel_tool_use", False)
        if kind == "tool":
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    try:
        return tc.parse_tools({"tools": chat, "tool_choice": choice, "parallel_tool_calls": parallel}, limits)
    except ApiError as e:  # the chat API's names for the same fields
        e.param = (e.param or "").replace(".function.parameters", ".input_schema").replace(".function.", ".")
        e.message = e.message.replace(".function.parameters", ".input_schema").replace(".function.", ".")
        raise


def _conversation(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages: at least one message is required", param="messages", code="invalid_value")
    system = body.get("system")
    out = [{"role": "system", "content": _text(system, "system")}] if system else []
    calls = set()
    for i, m in enumerate(msgs):
        for msg in _message(m, i):
            calls |= {c["id"] for c in msg.get("calls", [])}
            if msg["role"] == "tool" and msg["tool_call_id"] not in calls:
                raise ApiError(
                    400,
                    f"messages[{i}]: tool_result block(s) for unknown tool_use id {msg['tool_call_id'][:80]!r}",
                    param=f"messages[{i}].content",
                    code="invalid_value",
                )
            out.append(msg)
    if msgs[-1].get("role") == "assistant":
        raise ApiError(
            400,
            "a final assistant message (prefill) is not supported: end with a user message",
            param=f"messages[{len(msgs) - 1}]",
            code="unsupported_parameter",
        )
    return out


def read_request(body: dict, limits: Limits | None = None, counting: bool = False) -> MessagesRequest:
    limits = limits or Limits()
    msgs = given if isinstance(given := body.get("messages"), list) else []
    at_most(len(msgs), limits.max_messages, "messages", "max_messages", "messages")  # before any is read
    blocks = [m.get("content") for m in msgs if isinstance(m, dict)] + [body.get("system")]
    n = sum(len(b) for b in blocks if isinstance(b, list))
    at_most(n, limits.max_content_parts, "content blocks", "max_content_parts", "messages")
    known = (COUNT_KNOWN if counting else KNOWN) | IGNORED
    top = {k: v for k, v in body.items() if k in known - IGNORED and k not in ("messages", "tools", "system")}
    top.pop("tool_choice", None)  # read with the tools (_tools)
    checked = check(MessageCountTokensParams if counting else MessageCreateParamsBase, {**top, "messages": []}, "")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "stream: must be a boolean", param="stream", code="invalid_type")
    checked["stream"] = bool(body.get("stream", False))
    for name, lo, hi in (("temperature", 0, 1), ("top_p", 0, 1), ("top_k", 1, 1 << 20)):
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (name == "top_k" and not isinstance(v, int)):
            raise ApiError(400, f"{name}: must be a number", param=name, code="invalid_type")
        if not lo <= v <= hi or (name == "top_p" and v == 0):
            raise ApiError(400, f"{name}: must be between {lo} and {hi}", param=name, code="out_of_range")
        checked[name] = v
    if not counting:
        if "max_tokens" not in body:
            raise ApiError(400, "max_tokens: Field required", param="max_tokens", code="missing_required_parameter")
        if checked["max_tokens"] < 1:
            raise ApiError(400, "max_tokens: must be at least 1", param="max_tokens", code="out_of_range")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            raise ApiError(400, "system: must be a string or a list of text blocks", param="system")
        for j, b in enumerate(system):
            check(TextBlockParam, b, f"system[{j}]")
    return MessagesRequest(checked, _conversation(body), _tools(body, limits), sorted(set(body) - known))


def to_spec(req: MessagesRequest, limits: Limits, model: str) -> GenerationSpec:
    b = req.body
    stop = list(b.get("stop_sequences") or [])
    if len(stop) > limits.max_stop or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(
            400,
            f"stop_sequences: at most {limits.max_stop} non-empty strings",
            param="stop_sequences",
            code="invalid_value",
        )
    at_most(max(map(len, stop), default=0), limits.max_stop_chars, "stop_sequences: characters of a sequence",
            "max_stop_chars", "stop_sequences")  # fmt: skip
    prefill = req.tools.opening() if req.tools is not None and req.tools.active else ""
    return GenerationSpec(
        kind="chat",
        api="messages",
        clamp=True,
        model=b.get("model") or model,
        prompt=render_chat(req.messages, req.tools) + prefill,
        max_tokens=b.get("max_tokens") or limits.max_tokens,
        temperature=1.0 if b.get("temperature") is None else b["temperature"],
        top_p=1.0 if b.get("top_p") is None else b["top_p"],
        top_k=b.get("top_k") or -1,
        stop=stop,
        stream=b["stream"],
        tools=req.tools,
        prefill=prefill,
        messages=req.messages,
        user=(b.get("metadata") or {}).get("user_id"),
    )


# ----------------------------------------------------------------------------- what goes back


def stop_of(turn, spec: GenerationSpec) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop string the answer ended on is `stop_sequence`."""
    matched = (turn.res.finish or {}).get("matched")
    if turn.finish == "stop" and isinstance(matched, str) and matched in spec.stop:
        return "stop_sequence", matched
    return STOP_REASONS.get(turn.finish, "end_turn"), None


def content_blocks(turn) -> list[dict]:
    out = [{"type": "text", "text": turn.content}] if turn.content else []
    for c in turn.calls:
        out.append({"type": "tool_use", "id": c["id"], "name": c["name"], "input": json.loads(c["arguments"])})
    return out


def usage(turn_or_prompt, output_tokens: int | None = None) -> dict:
    """Anthropic counts cache reads apart from input_tokens (their sum is the prompt)."""
    if isinstance(turn_or_prompt, int):
        prompt, cached, out = turn_or_prompt, 0, output_tokens or 0
    else:
        prompt, cached = turn_or_prompt.prompt_tokens, turn_or_prompt.res.cached_tokens or 0
        out = turn_or_prompt.completion_tokens if output_tokens is None else output_tokens
    return {
        "input_tokens": prompt - cached,
        "output_tokens": out,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_body(mid: str, spec: GenerationSpec, turn) -> dict:
    reason, seq = stop_of(turn, spec)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": spec.model,
        "content": content_blocks(turn),
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(turn),
        "model_version": turn.version,
        "session_id": spec.session.session_id if spec.session is not None else None,
    }
