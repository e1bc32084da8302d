"""Request parts checked against the official SDKs' own request types (openai and anthropic, TypedDicts),
through pydantic, strictly: a wrong type is an error, never coerced ("1" is not 1).

Why the SDKs' types and not SGLang's protocol models (sglang.srt.entrypoints.openai/anthropic.protocol, the
same shapes as pydantic models): importing those loads SGLang and torch into the gateway, measured 6.6 s and
828 MB resident for a validation; the SDKs' types cost 0.5 s and ~100 MB, and are what the clients build their
bodies from.

A TypedDict's `Iterable` fields are checked lazily by pydantic (a ValidatorIterator); `check` walks them
into lists while it can still turn their errors into the API's 400.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from pydantic import TypeAdapter, ValidationError

from serving.protocol.schema import ApiError


@lru_cache(maxsize=None)
def adapter(typ) -> TypeAdapter:
    return TypeAdapter(typ)


class _Invalid(Exception):
    def __init__(self, loc: tuple, msg: str):
        self.loc, self.msg = loc, msg


def _first(e: ValidationError, prefix: tuple = ()) -> _Invalid:
    """The error to report. A union reports every member's complaint: those of members whose `type` is not
    the value's are dropped, and of the rest the one that got furthest into the value says most."""
    errors = e.errors()
    wrong_type = {x["loc"][:-1] for x in errors if x["loc"][-1:] == ("type",) and x["type"] == "literal_error"}
    relevant = [x for x in errors if not any(x["loc"][: len(w)] == w for w in wrong_type)] or errors
    err = max(relevant, key=lambda x: len([p for p in x["loc"] if _is_field(p)]))
    return _Invalid(prefix + tuple(err["loc"]), err["msg"])


def _is_field(part) -> bool:
    """A step of a pydantic error location that names a field or an index, not a union member's type."""
    return isinstance(part, int) or (isinstance(part, str) and "[" not in part and not part[:1].isupper())


def _materialize(v, loc: tuple = ()):
    if isinstance(v, dict):
        return {k: _materialize(x, loc + (k,)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_materialize(x, loc + (i,)) for i, x in enumerate(v)]
    if isinstance(v, Iterator):  # pydantic's ValidatorIterator: validates each item as it is read
        out: list = []
        while True:
            try:
                x = next(v)
            except StopIteration:
                return out
            except ValidationError as e:  # its location starts at the item's index
                raise _first(e, loc) from None
            out.append(_materialize(x, loc + (len(out),)))
    return v


def _where(prefix: str, loc: tuple) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _is_field(part):
            out += f".{part}" if out else str(part)
    return out


def _without_nulls(v):
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_nulls(x) for x in v]
    return v


def check(typ, value, where: str, nullable: tuple[str, ...] = ()):
    """`value` as the TypedDict `typ` checks it (strict), as plain dicts and lists; ApiError 400 naming the
    first field that fails. A null is an absent field (clients send both, and the SDKs' own dumps write
    nulls their request types do not take); `nullable` names top-level fields the type requires yet allows
    null, which are null when absent."""
    value = _without_nulls(value)
    if isinstance(value, dict):
        value = {**dict.fromkeys(nullable), **value}
    try:
        try:
            return _materialize(adapter(typ).validate_python(value, strict=True))
        except ValidationError as e:
            raise _first(e) from None
    except _Invalid as e:
        param = _where(where, e.loc)
        raise ApiError(400, f"{param or 'body'}: {e.msg}", param=param or None, code="invalid_value") from None
