"""How contracts.events decodes a record it cannot trust: the types and ranges of every field, the packed
arrays, and BadRecord with the reason a record is refused.

Anyone who can write to the broker writes what consumers read, so a decoder checks everything they rely on before
an event exists: a string where a number goes, a NaN, a negative id, a list of ten thousand items, a time next
century, bytes that do not fill their shape. Field types come from the event dataclasses' own annotations, so a
field added later is checked like the others without anyone remembering to.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

# Why a record is refused (BadRecord.reason; a label of the consumers' bad-record counters, so a short fixed list).
REASONS = (
    "tombstone",  # no value at all (a delete marker on a compacted topic)
    "not_msgpack",  # garbage bytes
    "not_a_map",
    "unknown_schema",
    "wrong_topic",  # a valid event of another kind than the topic carries
    "missing_field",
    "wrong_type",  # a field of the wrong type (a string where a number goes, a bool for an int, ...)
    "out_of_range",  # not finite, negative, from the future, too long, too many
    "invalid",  # each field fine, together not an event (an unknown kind, a shape that does not match its bytes)
)
MAX_ID_CHARS = 256  # ids (event, completion, session, parent, tenant): they are kept in the consumers' dedupe sets
MAX_TEXT_CHARS = 8192  # any other string
MAX_LIST_ITEMS = 1024  # spans, secret types
MAX_CHOICES = 1024  # choice_index is below this (the gateway's limits.max_n is far lower)
MAX_FUTURE_S = 86400.0  # an event's ts may be this far ahead of the reader's clock (skew), no further
MAX_EXPERT_DIMS = 4


class BadRecord(ValueError):
    """A record that is not a valid Flywheel event. Records read from the broker are untrusted input: consumers
    count it by `reason` (one of REASONS), dead-letter it and go on (infra.dead_letter), never crash."""

    def __init__(self, detail: str, reason: str = "invalid"):
        super().__init__(detail)
        self.reason = reason


def field_rules(cls) -> dict[str, tuple[tuple[type, ...], bool]]:
    """field -> (accepted types, None allowed), from the dataclass's own annotations: a field added later is
    checked like the others without anyone remembering to. The arrays and the version are decoded apart."""
    types = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,), "list": (list,)}
    rules = {}
    for f in fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        if parts[0] in ("np.ndarray", "Version"):
            continue
        if parts[0] not in types or set(parts[1:]) - {"None"}:
            raise TypeError(f"{cls.__name__}.{f.name}: no decoding rule for {f.type!r}")
        rules[f.name] = (types[parts[0]], "None" in parts[1:])
    return rules


def check_fields(d: dict, rules: dict, now: float) -> None:
    """Types and ranges of every field a record has: numbers finite and non-negative (every count, time and
    index in these schemas is), ids and strings of bounded length, lists of bounded length, ts not ahead."""
    for name, value in d.items():
        accepted, nullable = rules.get(name, ((object,), True))
        if value is None and nullable:
            continue
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            raise BadRecord(
                f"{name} is {type(value).__name__}, not {'/'.join(t.__name__ for t in accepted)}", "wrong_type"
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or value < 0:
                raise BadRecord(f"{name} is {value!r}: not a finite non-negative number", "out_of_range")
        elif isinstance(value, str):
            limit = MAX_ID_CHARS if name.endswith("_id") or name == "tenant" else MAX_TEXT_CHARS
            if len(value) > limit:
                raise BadRecord(f"{name} is longer than {limit} characters", "out_of_range")
        elif isinstance(value, list) and len(value) > MAX_LIST_ITEMS:
            raise BadRecord(f"{name} has more than {MAX_LIST_ITEMS} items", "out_of_range")
    if d.get("choice_index", 0) >= MAX_CHOICES:
        raise BadRecord(f"choice_index {d['choice_index']} is not below {MAX_CHOICES}", "out_of_range")
    if "ts" in d and d["ts"] > now + MAX_FUTURE_S:
        raise BadRecord(f"ts {d['ts']} is more than {MAX_FUTURE_S:.0f}s ahead of this reader's clock", "out_of_range")
    if not all(isinstance(t, str) for t in d.get("secret_types") or ()):
        raise BadRecord("secret_types are not strings", "wrong_type")


def _array(d: dict, name: str, dtype: str) -> np.ndarray:
    raw = d[name]
    if not isinstance(raw, bytes):
        raise BadRecord(f"{name} is {type(raw).__name__}, not packed bytes", "wrong_type")
    if len(raw) % np.dtype(dtype).itemsize:
        raise BadRecord(f"{name}: {len(raw)} bytes are not a whole number of {dtype}", "invalid")
    return np.frombuffer(raw, dtype)


def completion_arrays(d: dict) -> None:
    """The packed arrays in place of their bytes: token ids non-negative, logprobs finite, routed experts of a
    shape (a short list of non-negative ints) that their bytes fill exactly."""
    for name in ("prompt_ids", "output_ids"):
        d[name] = a = _array(d, name, "<i4")
        if a.size and int(a.min()) < 0:
            raise BadRecord(f"{name}: a negative token id", "out_of_range")
    d["logprobs"] = lp = _array(d, "logprobs", "<f4")
    if not np.all(np.isfinite(lp)):
        raise BadRecord("logprobs: not all finite", "out_of_range")
    shape = d.pop("routed_experts_shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_EXPERT_DIMS:
        raise BadRecord(f"routed_experts_shape is not a list of 1-{MAX_EXPERT_DIMS} ints", "wrong_type")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
        raise BadRecord("routed_experts_shape holds something other than non-negative ints", "out_of_range")
    experts = _array(d, "routed_experts", "u1")
    if math.prod(shape) != experts.size:
        raise BadRecord(f"routed experts: {experts.size} bytes do not fill the shape {shape}", "invalid")
    d["routed_experts"] = experts.reshape(shape)
