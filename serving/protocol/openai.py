"""OpenAI-compatible request validation and response shapes (completions, chat, errors).

Validation turns a client's JSON into a `GenerationSpec` or raises `ApiError` with the OpenAI error
body; nothing here talks to an engine. Field names and defaults follow the OpenAI API so existing IDE
clients (Continue, Cline, Tabby's OpenAI backend, the official SDK) work unchanged.

Why one file: it is the whole contract with OpenAI clients, request shapes and response shapes
together, so a field's parsing and its echo in the answer are read side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serving.protocol.limits import Limits
from serving.protocol.schema import ApiError, Field, at_most, boolean, integer, number, refuse_unknown, string, value

if TYPE_CHECKING:
    from serving.signals.sessions import Link


@dataclass
class GenerationSpec:
    """What one request asks for, independent of which API shape it came in."""

    kind: str  # "completion" | "chat" (a conversation, whichever API it came in)
    model: str
    prompt: str
    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0  # vLLM's extension: end-of-text and stop tokens are not sampled before this many
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # Messages API: sample among the k most likely tokens (-1: all)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # completions: top-k count; chat: top_logprobs (0 with logprobs=true)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    suffix: str | None = None
    user: str | None = None
    tools: Any = None  # serving.protocol.tool_calls.ToolSpec when the request has tools (it imports this module)
    prefill: str = ""  # text the answer starts with (part of the prompt: a forced tool call's opening)
    messages: list | None = None  # chat: the checked messages (role, content, calls, tool_call_id)
    session_hint: str | None = None  # chat: a session id the client gave (metadata.session_id, X-Session-Id)
    session: Link | None = None  # set by the gateway
    api: str = ""  # the API it came in: completions | chat | responses | messages (logged with the event)
    # Responses and Messages: max_tokens is a ceiling the server may lower (to its limit, to what the context
    # leaves after the prompt), as those APIs' own servers do; the chat and completions APIs refuse instead.
    clamp: bool = False
    prompt_tokens: int = 0  # set by the prompter once it has tokenized the prompt

    def sampling(self) -> dict:
        """The sampling parameters as logged with each completion event."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            **({"top_k": self.top_k} if self.top_k > 0 else {}),
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "stop": self.stop,
            "n": self.n,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "fim": self.suffix is not None,
            "tools": len(self.tools.tools) if self.tools is not None and self.tools.active else 0,
        }


# ----------------------------------------------------------------------------- field validators
# The flat fields go through serving.protocol.schema's checks, like every other body the gateway takes.


def _bool(body: dict, name: str, default: bool) -> bool:
    return value(body, name, Field(boolean(), default))


def _int(body: dict, name: str, default, lo: int, hi: int, limit_code: str = "out_of_range"):
    return value(body, name, Field(integer(lo, hi, limit_code), default))


def _float(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    return value(body, name, Field(number(lo, hi), default))


def _str(body: dict, name: str, required: bool = False, default=None):
    return value(body, name, Field(string(), default, required))


def _stop(body: dict, limits: Limits) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise ApiError(400, "'stop' must be a non-empty string or a list of them", param="stop", code="invalid_type")
    if len(v) > limits.max_stop:
        raise ApiError(400, f"'stop' takes at most {limits.max_stop} sequences", param="stop", code="out_of_range")
    at_most(max(map(len, v)), limits.max_stop_chars, "'stop': characters of a sequence", "max_stop_chars", "stop")
    return v


def _unsupported(body: dict, names: Mapping[str, object]) -> None:
    """Fields clients may send with a neutral value; any other value is refused, not silently ignored."""
    for name, neutral in names.items():
        if name in body and body[name] not in (None, neutral):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")


COMMON = {
    "model",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "logit_bias",
}


def _common(body: dict, limits: Limits) -> dict:
    opts = body.get("stream_options")
    # include_obfuscation pads chunks against length side channels on OpenAI's side; nothing to pad here.
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"}):
        raise ApiError(
            400, "'stream_options' must be an object with 'include_usage'", param="stream_options", code="invalid_type"
        )
    _unsupported(body, {"logit_bias": {}})
    out = dict(
        model=_str(body, "model", required=True),
        n=_int(body, "n", 1, 1, limits.max_n),
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
        stop=_stop(body, limits),
        stream=_bool(body, "stream", False),
        include_usage=bool(opts and _bool(opts, "include_usage", False)),
        seed=_int(body, "seed", None, -(2**63), 2**63 - 1),
        presence_penalty=_float(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_float(body, "frequency_penalty", 0.0, -2.0, 2.0),
        user=_str(body, "user"),
    )
    out["min_tokens"] = _int(body, "min_tokens", 0, 0, limits.max_tokens)
    if out["top_p"] == 0.0:
        raise ApiError(400, "'top_p' must be greater than 0", param="top_p", code="out_of_range")
    if opts is not None and not out["stream"]:
        raise ApiError(400, "'stream_options' is only allowed with stream=true", param="stream_options")
    return out


def parse_completion(body: dict, limits: Limits) -> GenerationSpec:
    refuse_unknown(body, COMMON | {"prompt", "suffix", "logprobs", "echo", "best_of"})
    _unsupported(body, {"echo": False, "best_of": 1})
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # clients often wrap a single prompt in a list
    if isinstance(prompt, list):
        raise ApiError(
            400, "'prompt' must be a string (batches of prompts are not supported)", param="prompt", code="invalid_type"
        )
    if not isinstance(prompt, str):
        raise ApiError(
            400,
            "'prompt' must be a string",
            param="prompt",
            code="missing_required_parameter" if prompt is None else "invalid_type",
        )
    suffix = _str(body, "suffix")
    if not prompt and not suffix:
        raise ApiError(400, "'prompt' must not be empty", param="prompt", code="empty_prompt")
    return _lengths(
        GenerationSpec(
            kind="completion",
            api="completions",
            prompt=prompt,
            suffix=suffix,
            max_tokens=_int(body, "max_tokens", 16, 1, limits.max_tokens),
            logprobs=_int(body, "logprobs", None, 0, 5),
            **_common(body, limits),
        )
    )


def _lengths(spec: GenerationSpec) -> GenerationSpec:
    if spec.min_tokens > spec.max_tokens:
        raise ApiError(
            400,
            f"'min_tokens' ({spec.min_tokens}) must not exceed 'max_tokens' ({spec.max_tokens})",
            param="min_tokens",
            code="out_of_range",
        )
    return spec


ROLES = ("system", "developer", "user", "assistant", "tool")

# OpenAI chat fields (the official SDK's CompletionCreateParams, openai 2.8) that mean nothing to this
# server: accepted and ignored (docs/gateway.md lists them).
IGNORED_CHAT = {
    "store",
    "metadata",
    "reasoning_effort",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "verbosity",
}
# Fields for what this server does not do: refused unless neutral (a client asking for audio out must know).
UNSUPPORTED_CHAT = {"audio": None, "modalities": ["text"], "prediction": None, "web_search_options": None}


def render_chat(messages: list[dict], tools=None) -> str:
    """Our coder has no chat template: a conversation becomes a Python comment block, and the
    assistant's reply is the code that follows it. Tools (serving.protocol.tool_calls) add a `# tools:` line per
    function; calls and tool results are written in the Qwen format, as the model writes and reads them."""
    from contracts import tool_format as tf
    from serving.protocol import tool_calls as tc

    try:
        return tf.render_chat(messages, tc.tools_header(tools) if tools is not None and tools.active else [])
    except RecursionError:  # a call's arguments, a JSON string, nested past what Python's json reads
        raise ApiError(
            400,
            "a tool call's arguments are nested too deeply to read (JSON in a string counts too: max_json_depth)",
            param="messages",
            code="invalid_value",
        ) from None


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if c is None and m.get("role") == "assistant" and m.get("tool_calls"):
        return ""  # an assistant turn that only called tools
    if isinstance(c, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c
    ):
        return "".join(p["text"] for p in c)
    raise ApiError(
        400,
        f"messages[{i}].content must be a string or a list of text parts",
        param=f"messages[{i}].content",
        code="invalid_type",
    )


def _messages(msgs, tools, limits: Limits) -> list[dict]:
    from serving.protocol import tool_calls as tc

    if not isinstance(msgs, list) or not msgs:
        raise ApiError(
            400,
            "'messages' must be a non-empty list",
            param="messages",
            code="missing_required_parameter" if msgs is None else "invalid_type",
        )
    at_most(len(msgs), limits.max_messages, "'messages'", "max_messages", "messages")
    parts = sum(
        len(m[k]) for m in msgs if isinstance(m, dict) for k in ("content", "tool_calls") if isinstance(m.get(k), list)
    )
    at_most(parts, limits.max_content_parts, "'messages': content parts", "max_content_parts", "messages")
    clean, call_ids = [], set()
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            what = " (the legacy 'function' role: send tool messages)" if role == "function" else ""
            raise ApiError(
                400,
                f"messages[{i}].role must be one of {', '.join(ROLES)}{what}",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        allowed = (
            {"role", "content", "name"}
            | ({"tool_calls", "refusal", "audio", "function_call"} if role == "assistant" else set())
            | ({"tool_call_id"} if role == "tool" else set())
        )
        extra = sorted(set(m) - allowed)
        if extra:
            raise ApiError(
                400,
                f"messages[{i}]: unrecognized field {extra[0]!r} for role {role}",
                param=f"messages[{i}].{extra[0]}",
                code="unknown_parameter",
            )
        if m.get("function_call") is not None or m.get("audio") is not None:
            raise ApiError(
                400,
                f"messages[{i}]: 'function_call' and 'audio' are not supported (use tool_calls)",
                param=f"messages[{i}]",
                code="unsupported_parameter",
            )
        entry = {"role": role, "content": _content(m, i)}
        if role == "tool":
            entry["tool_call_id"] = m.get("tool_call_id")
        if role == "assistant":
            entry["calls"] = tc.assistant_calls(m, i)
            call_ids |= {c["id"] for c in entry["calls"]}
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise ApiError(
                    400,
                    f"messages[{i}].tool_call_id is required for role tool",
                    param=f"messages[{i}].tool_call_id",
                    code="missing_required_parameter",
                )
            if tid not in call_ids:
                raise ApiError(
                    400,
                    f"messages[{i}] answers tool call {tid[:80]!r}, which no earlier assistant message made",
                    param=f"messages[{i}].tool_call_id",
                    code="invalid_value",
                )
        clean.append(entry)
    if not any(m["content"].strip() or m.get("calls") for m in clean):
        raise ApiError(400, "'messages' contain no text", param="messages", code="empty_prompt")
    return clean


def parse_chat(body: dict, limits: Limits) -> GenerationSpec:
    from serving.protocol import tool_calls as tc

    refuse_unknown(
        body,
        COMMON
        | {
            "messages",
            "max_completion_tokens",
            "logprobs",
            "top_logprobs",
            "tools",
            "tool_choice",
            "response_format",
            "parallel_tool_calls",
            "functions",
            "function_call",
        }
        | IGNORED_CHAT
        | set(UNSUPPORTED_CHAT),
    )
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise ApiError(
            400,
            "'functions' and 'function_call' are deprecated and not supported: send 'tools' and 'tool_choice'",
            param="functions" if "functions" in body else "function_call",
            code="unsupported_parameter",
        )
    _unsupported(body, UNSUPPORTED_CHAT)
    meta = body.get("metadata")
    if meta is not None and (
        not isinstance(meta, dict)
        or len(meta) > 16
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in meta.items()
        )
    ):
        raise ApiError(
            400,
            "'metadata' must be at most 16 string pairs (keys up to 64 chars, values up to 512)",
            param="metadata",
            code="invalid_value",
        )
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise ApiError(
            400,
            "only response_format {'type': 'text'} is supported: the engine runs without a grammar "
            "backend, so JSON output could not be guaranteed",
            param="response_format",
            code="unsupported_parameter",
        )
    tools = tc.parse_tools(body, limits)
    clean = _messages(body.get("messages"), tools, limits)
    max_tokens = _int(body, "max_completion_tokens", None, 1, limits.max_tokens)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 16, 1, limits.max_tokens)
    want_lp = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, 0, 5)
    if top is not None and not want_lp:
        raise ApiError(400, "'top_logprobs' requires logprobs=true", param="top_logprobs")
    prefill = tools.opening() if tools is not None and tools.active else ""
    return _lengths(
        GenerationSpec(
            kind="chat",
            api="chat",
            prompt=render_chat(clean, tools) + prefill,
            max_tokens=max_tokens,
            logprobs=(top or 0) if want_lp else None,
            tools=tools,
            prefill=prefill,
            messages=clean,
            session_hint=(meta or {}).get("session_id"),
            **_common(body, limits),
        )
    )


# ----------------------------------------------------------------------------- responses


def finish_reason(sglang_finish: dict | None) -> str:
    kind = (sglang_finish or {}).get("type")
    return "length" if kind == "length" else "stop"


def completion_logprobs(tokens: list[str], logprobs: list[float], tops: list[dict] | None, offset0: int) -> dict:
    offsets, pos = [], offset0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokens: list[str], logprobs: list[float], tops: list[dict] | None) -> dict:
    content = []
    for i, (t, lp) in enumerate(zip(tokens, logprobs)):
        alts = [{"token": k, "logprob": v, "bytes": list(k.encode())} for k, v in (tops[i] if tops else {}).items()]
        content.append({"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": alts})
    return {"content": content, "refusal": None}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` when the replica said how many prompt
    tokens its prefix cache held (of the first choice: the choices of one request share the prompt)."""
    out: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out
