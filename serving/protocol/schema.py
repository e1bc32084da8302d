"""Request-body validation: the OpenAI error shape and one mechanism that checks every body.

A body is declared as a `Schema`: a `Field` per name (a check, a default, required or not) plus rules that
relate fields to each other. `Schema.parse` refuses unknown fields, checks each field, then the rules, and
raises `ApiError` (status, message, param, code: what OpenAI clients show) at the first problem. The same
checks (`integer`, `number`, ...) serve the OpenAI bodies (serving.protocol.openai), whose nested parts
(messages, tools) are parsed by code of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


MAX_JSON_DEPTH = 64  # Limits.max_json_depth: the default where a body is read without the gateway's limits


def nesting(value, limit: int) -> bool:
    """Whether a JSON value nests at most `limit` containers deep, checked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, d = stack.pop()
        if d > limit:
            return False
        for x in node.values() if isinstance(node, dict) else node:
            if isinstance(x, (dict, list)):
                stack.append((x, d + 1))
    return True


def parse_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict:
    """A body as a JSON object, nested at most `max_depth` deep (orjson takes 1024; Python's own json, pydantic
    and every recursive walk of it here would overflow before that: a 500, or worse, where a 400 is due)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_encoding") from None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ApiError(
            400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") > max_depth and not nesting(body, max_depth):
        raise ApiError(
            400, f"request body is nested deeper than {max_depth} levels (max_json_depth)", code="invalid_json"
        )
    return body


def at_most(count: int, limit: int, what: str, name: str, param: str | None = None) -> None:
    """A bounded count, checked before the work it bounds: over `limit`, a 400 naming the limit (`name`, the
    serving.protocol.limits.Limits field that sets it)."""
    if count > limit:
        raise ApiError(
            400, f"{what}: {count}, more than the limit of {limit} ({name})", param=param, code="out_of_range"
        )


# ----------------------------------------------------------------------------- checks
# A check takes a present, non-null value and the field's name; it returns the clean value or raises.
Check = Callable[[Any, str], Any]


def boolean() -> Check:
    def check(v, name):
        if not isinstance(v, bool):
            raise ApiError(400, f"'{name}' must be a boolean", param=name, code="invalid_type")
        return v

    return check


def integer(lo: int, hi: int, range_code: str = "out_of_range", what: str | None = None) -> Check:
    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ApiError(400, what or f"'{name}' must be an integer", param=name, code="invalid_type")
        if not lo <= v <= hi:
            raise ApiError(400, what or f"'{name}' must be between {lo} and {hi}, got {v}", param=name, code=range_code)
        return v

    return check


def number(lo: float, hi: float, what: str | None = None, open_lo: bool = False, open_hi: bool = False) -> Check:
    """A finite JSON number in [lo, hi] (open at either end on request), as a float."""

    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ApiError(400, what or f"'{name}' must be a number", param=name, code="invalid_type")
        if not (lo < v if open_lo else lo <= v) or not (v < hi if open_hi else v <= hi):
            raise ApiError(
                400, what or f"'{name}' must be between {lo} and {hi}, got {v}", param=name, code="out_of_range"
            )
        return float(v)

    return check


def string(max_len: int | None = None, printable_ascii: bool = False, nonempty: bool = False) -> Check:
    def check(v, name):
        if not isinstance(v, str):
            raise ApiError(400, f"'{name}' must be a string", param=name, code="invalid_type")
        bad = (nonempty and not v) or (max_len is not None and len(v) > max_len)
        bad = bad or (printable_ascii and not (v.isascii() and v.isprintable()))
        if bad:
            shape = f"1-{max_len} printable ASCII characters" if printable_ascii else "a non-empty string"
            raise ApiError(400, f"'{name}' must be {shape}", param=name, code="invalid_value")
        return v

    return check


def one_of(*choices) -> Check:
    def check(v, name):
        if isinstance(v, bool) or v not in choices:
            raise ApiError(
                400, f"'{name}' must be one of {', '.join(map(str, choices))}", param=name, code="invalid_value"
            )
        return v

    return check


def string_list(nonempty: bool = True) -> Check:
    def check(v, name):
        if not isinstance(v, list) or (nonempty and not v) or not all(isinstance(s, str) for s in v):
            raise ApiError(400, f"'{name}' must be a non-empty list of strings", param=name, code="invalid_type")
        return list(v)

    return check


# ----------------------------------------------------------------------------- fields and schemas


@dataclass(frozen=True)
class Field:
    check: Check
    default: Any = None
    required: bool = False


def value(body: dict, name: str, field: Field) -> Any:
    """One field of a body: its default when absent or null, else checked."""
    v = body.get(name)
    if v is None:
        if field.required:
            raise ApiError(400, f"'{name}' is required", param=name, code="missing_required_parameter")
        return field.default
    return field.check(v, name)


def refuse_unknown(body: dict, allowed) -> None:
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise ApiError(
            400, f"Unrecognized request argument supplied: {extra[0]}", param=extra[0], code="unknown_parameter"
        )


class Body(dict):
    """A checked body: every declared field (absent ones at their default), and which ones the client sent."""

    def __init__(self, values: dict, given: frozenset[str]):
        super().__init__(values)
        self.given = given


Rule = Callable[[Body], None]


class Schema:
    def __init__(self, fields: dict[str, Field], rules: tuple[Rule, ...] = (), ignore_unknown: bool = False):
        """ignore_unknown: for bodies whose clients add fields of their own (Tabby's events); anything
        else refuses a field it does not know rather than silently dropping it."""
        self.fields, self.rules, self.ignore_unknown = fields, rules, ignore_unknown

    def parse(self, body: dict | bytes) -> Body:
        if isinstance(body, (bytes, bytearray)):
            body = parse_json_body(body) if bytes(body).strip() else {}
        if not self.ignore_unknown:
            refuse_unknown(body, self.fields)
        out = Body(
            {name: value(body, name, f) for name, f in self.fields.items()},
            frozenset(k for k, v in body.items() if v is not None),
        )
        for rule in self.rules:
            rule(out)
        return out
