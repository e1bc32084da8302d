"""What one request may ask of the gateway (Limits): each bound is a clear 400 naming it, checked before the
work it bounds. Read by every API's schema (serving.protocol.openai, responses, messages), the tool checks
(serving.protocol.tool_calls) and the prompt (serving.protocol.prompts)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.config import option


@dataclass
class Limits:
    # Agent clients send whole conversations every turn: Codex's first request is ~100 KB of JSON
    max_body_bytes: int = 8 << 20
    max_prompt_tokens: int = option(0, help="longest prompt accepted, in tokens (0: what the model's context holds)")
    max_tokens: int = 4096
    max_n: int = 8
    max_stop: int = 4
    context_tokens: int = option(0, help="prompt + max_tokens must fit in this many tokens (0: the model's positions)")
    # Bounded work per request: each of these is a clear 400 naming it, checked before the work it bounds.
    max_stop_chars: int = 256  # a stop sequence is matched against the answer's tail at every decode step
    max_json_depth: int = 64  # containers nested in a body (code that walks it recursively must not overflow)
    max_messages: int = 4096  # messages, Responses input items (with the stored conversation), per request
    max_content_parts: int = 8192  # text parts / content blocks of all messages (each is checked on its own)
    max_schema_nodes: int = 10_000  # JSON nodes of all tool schemas of a request (their checks walk every one)
    max_schema_expansion: int = option(
        10_000,
        help="tool schemas: most subschemas a call's check may apply to one value ($ref, anyOf, ... expanded); "
        "a schema over it is a 400",
    )
    max_argument_depth: int = 32  # a call's arguments nested deeper are an invalid call (recursive $ref's unroll)
    tool_call_timeout_s: float = option(
        1.0,
        help="seconds to check an answer's tool calls against their schemas, off the event loop; past it the "
        "call is invalid (returned as text)",
    )
    tool_schema_timeout_s: float = option(
        5.0,
        help="seconds to check a request's tool schemas (metaschema, refs, expansion), off the event loop; "
        "past it the request is a 400",
    )
