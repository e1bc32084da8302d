"""A client's tool schema, accepted only if checking a call against it is bounded work, and that check.

A tool's `parameters` is a JSON schema the client writes and the gateway runs on every call the model makes.
Its cost is not its size: `$ref` and the in-place applicators (anyOf, allOf, oneOf, not, if/then/else)
apply several subschemas to the same value, so an `anyOf` of two refs nested 40 times is a few hundred
bytes and 2^40 steps for any argument that fails it. So, when a request is read:
- nothing is fetched (local `#...` refs only), no patternProperties (a client regex over every key), a
  depth bound (deep nesting would exhaust Python's recursion), a bound on the nodes of all of a request's
  schemas together (the metaschema check walks every one: ~0.5 ms a node in pure Python), the whole read
  off the event loop within `tool_schema_timeout_s` when a body offers tools, and a schema seen before
  (agent clients send the same tools every turn) not checked again;
- the expansion is counted: the most subschemas a check may apply to one value of the arguments, every
  `$ref` expanded and a recursive one unrolled as deep as arguments may nest (`max_argument_depth`: an
  argument nested deeper is an invalid call). Over `max_schema_expansion` the request is a 400.
And when a call is read: the check runs off the event loop (a thread of its own), with a deadline every
keyword looks at; past it the call is invalid, the same path as arguments that fail the schema.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import orjson
import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from serving.protocol.schema import ApiError

MAX_SCHEMA_DEPTH = 32
PATTERN_TIMEOUT_S = 0.05  # one client regex on one string, at most
# Threads for each kind of off-loop work: reading a request's schemas (up to tool_schema_timeout_s each) and
# checking the model's calls (up to tool_call_timeout_s). Apart, so that requests offering fresh, costly schemas
# can delay only other requests' first read of theirs, never a call's check (a late check is an invalid call:
# a flood of schemas would otherwise turn every tenant's calls malformed). A queued job's deadline starts when
# its thread does: waiting is latency, not a failure.
VALIDATION_THREADS = {"read": 2, "call": 2}

_REFS = ("$ref",)
# A new base URI or anchor below the root changes what a $ref there resolves to, where the expansion count
# (which resolves from the root) would not follow; dynamic refs resolve by the dynamic scope: refused both.
_SCOPED = ("$id", "$anchor", "$dynamicAnchor")
_DYNAMIC = ("$dynamicRef", "$recursiveRef", "$recursiveAnchor")
# Keywords that apply subschemas to the value itself, and those that apply them to its children.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE = ("not", "if", "then", "else")
_CHILD = ("additionalProperties", "items", "contains", "propertyNames", "unevaluatedProperties", "unevaluatedItems")


class TimeUp(Exception):
    """A call's check ran past its deadline: the call is invalid."""


_deadline = threading.local()  # the monotonic time the running check must end by (none: unbounded)


def _remaining() -> float:
    return getattr(_deadline, "at", math.inf) - time.monotonic()


def _pattern(validator, patrn, instance, schema):
    """jsonschema's `pattern`, with a time bound (the `regex` module): a pathological pattern fails the
    arguments instead of running for as long as it takes."""
    if not validator.is_type(instance, "string"):
        return
    try:
        limit = max(0.001, min(PATTERN_TIMEOUT_S, _remaining()))
        found = regex.search(patrn, instance, timeout=limit, concurrent=True)  # the GIL is let go meanwhile
    except (TimeoutError, regex.error):
        found = None
    if not found:
        yield ValidationError(f"{instance[:80]!r} does not match {patrn[:80]!r}")


def _timed(keyword):
    """A keyword's check that first looks at the deadline: a long check stops within one keyword of it."""

    def check(validator, value, instance, schema):
        if _remaining() < 0:
            raise TimeUp()
        yield from keyword(validator, value, instance, schema)

    return check


# Client schemas: no $ref is ever fetched (an empty registry: local refs only), `pattern` is time-bounded,
# every keyword watches the deadline.
_KEYWORDS = {**Draft202012Validator.VALIDATORS, "pattern": _pattern}
Validator = validators.extend(Draft202012Validator, {k: _timed(f) for k, f in _KEYWORDS.items()})
NO_FETCH = Registry()
# The metaschema check (jsonschema's check_schema, its format checks included), on the same timed keywords
_META = Validator(Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


_accepted: OrderedDict[tuple, int] = OrderedDict()  # (digest, bounds) of a schema that passed -> its nodes
_accepted_lock = threading.Lock()  # requests are read on the checks' threads
ACCEPTED_CACHE = 4096  # schemas remembered: agent clients send the same tools with every turn


def check_schema(params: dict, where: str, limits, nodes_left: int) -> int:
    """jsonschema's check_schema (its metaschema's keywords watching the deadline too), and what it does not
    check: no remote or unresolvable $ref, no patternProperties, a depth bound, at most `nodes_left` nodes,
    a bounded expansion (module docstring). Returns the nodes used. A schema seen before (the same JSON, the
    same bounds) is not checked again: an agent's ~20 tools cost milliseconds of metaschema per turn."""
    try:
        raw = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        raw = None  # nested too deep for orjson (the walk below says so)
    key = raw and (
        hashlib.blake2b(raw, digest_size=16).digest(),
        limits.max_schema_expansion,
        limits.max_argument_depth,
    )
    with _accepted_lock:
        known = _accepted.get(key) if key else None
        if key and known is not None and known <= nodes_left:
            _accepted.move_to_end(key)
            return known
    nodes = _check(params, where, limits, nodes_left)
    if key:
        with _accepted_lock:
            _accepted[key] = nodes
            while len(_accepted) > ACCEPTED_CACHE:
                _accepted.popitem(last=False)
    return nodes


def _check(params: dict, where: str, limits, nodes_left: int) -> int:
    refs, nodes = [], 0

    def walk(node, depth: int) -> None:
        nonlocal nodes
        nodes += 1
        if nodes > nodes_left:
            raise ApiError(
                400,
                f"{where}: the tool schemas of one request may have at most {limits.max_schema_nodes} JSON nodes "
                "together",
                param=where,
                code="invalid_value",
            )
        if depth > MAX_SCHEMA_DEPTH:
            raise ApiError(
                400, f"{where} is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=where, code="invalid_value"
            )
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _REFS and (not isinstance(v, str) or not v.startswith("#")):
                    raise ApiError(
                        400,
                        f"{where}: only local references ('#...') are allowed in $ref",
                        param=where,
                        code="invalid_value",
                    )
                if k in _REFS:
                    refs.append(v)
                if k in _DYNAMIC or (k in _SCOPED and depth > 0):
                    raise ApiError(
                        400,
                        f"{where}: {k} is not supported" + (" below the schema's root" if k in _SCOPED else ""),
                        param=where,
                        code="unsupported_parameter",
                    )
                if k == "patternProperties":
                    raise ApiError(
                        400, f"{where}: patternProperties is not supported", param=where, code="unsupported_parameter"
                    )
                walk(v, depth + 1)
        elif isinstance(node, list):
            for v in node:
                walk(v, depth + 1)

    walk(params, 0)
    try:
        error = best_match(_META.iter_errors(params))
        if error is not None:
            raise SchemaError.create_from(error)
        resolver = NO_FETCH.with_resource("urn:tool", DRAFT202012.create_resource(params)).resolver("urn:tool")
        for ref in refs:  # a $ref that leads nowhere fails here, not when the model first calls the tool
            resolver.lookup(ref)
        cost = expansion(params, resolver, limits.max_argument_depth, limits.max_schema_expansion)
    except SchemaError as e:
        raise ApiError(
            400, f"{where} is not a valid JSON schema: {e.message}", param=where, code="invalid_value"
        ) from None
    except TimeUp:
        raise ApiError(
            400,
            f"{where}: checking the tool schemas took longer than tool_schema_timeout_s="
            f"{limits.tool_schema_timeout_s} s",
            param=where,
            code="invalid_value",
        ) from None
    except _SelfRef:
        raise ApiError(
            400,
            f"{where}: a $ref leads back to itself without descending into the arguments (no value could pass)",
            param=where,
            code="invalid_value",
        ) from None
    except Exception as e:  # noqa: BLE001 - unresolvable or self-referential $ref (RecursionError too)
        raise ApiError(
            400, f"{where} cannot be used ({type(e).__name__}): check its $ref", param=where, code="invalid_value"
        ) from None
    if cost > limits.max_schema_expansion:
        raise ApiError(
            400,
            f"{where}: checking a call could apply more than {limits.max_schema_expansion} subschemas to one "
            f"value ($ref, anyOf, allOf, oneOf expanded; the limit is max_schema_expansion="
            f"{limits.max_schema_expansion})",
            param=where,
            code="invalid_value",
        )
    return nodes


class _SelfRef(Exception):
    pass


def expansion(root, resolver, depth: int, cap: int) -> int:
    """The most subschemas a check of arguments nested at most `depth` deep applies to one of their values,
    every $ref expanded: max over levels d of G(root, d), where G(s, d) counts the subschemas applied at
    depth d below a value s is applied to. Applied in place (refs, anyOf, ...) they add up; of a node's
    children one key takes `properties[key]` or `additionalProperties`, so the heaviest counts. Values are
    capped at cap + 1 (enough to refuse), so the arithmetic stays small whatever the fan-out."""
    memo: dict[tuple[int, int], int] = {}
    in_place: set[tuple[int, int]] = set()  # (node, d) being counted: met again in place, it never ends

    def target(ref: str):
        return resolver.lookup(ref).contents

    def g(s, d: int) -> int:
        if s is None or d < 0:
            return 0  # no such keyword, or below the deepest value
        if not isinstance(s, dict):
            return 1 if d == 0 else 0  # a boolean schema applies itself, nothing below
        key = (id(s), d)
        if key in memo:
            return memo[key]
        if key in in_place:
            raise _SelfRef()
        in_place.add(key)
        total = 1 if d == 0 else 0
        for k, v in s.items():
            if k in _REFS and isinstance(v, str):
                total += g(target(v), d)
            elif k in _IN_PLACE_LISTS and isinstance(v, list):
                total += sum(g(x, d) for x in v)
            elif k in _IN_PLACE:
                total += g(v, d)
            elif k == "dependentSchemas" and isinstance(v, dict):
                total += sum(g(x, d) for x in v.values())
        if d > 0:  # one child value: the heaviest subschema its key or index could take, of each kind
            props = p if isinstance(p := s.get("properties"), dict) else {}
            items = i if isinstance(i := s.get("prefixItems"), list) else []
            total += max([g(x, d - 1) for x in props.values()] + [g(s.get("additionalProperties"), d - 1)])
            total += max([g(x, d - 1) for x in items] + [g(s.get("items"), d - 1)])
            total += sum(g(s.get(k), d - 1) for k in _CHILD if k not in ("additionalProperties", "items"))
        in_place.discard(key)
        memo[key] = min(total, cap + 1)
        return memo[key]

    worst = 0
    for d in range(depth + 1):
        here = g(root, d)
        worst = max(worst, here)
        if worst > cap or here == 0:  # nothing applies at this depth: nothing below it either
            break
    return worst


# ----------------------------------------------------------------------------- checking calls

_pools: dict[str, ThreadPoolExecutor] = {}


def run_bounded(fn, timeout_s: float):
    """fn() with every tool-call check in it bounded by `timeout_s` (in this thread)."""
    _deadline.at = time.monotonic() + timeout_s
    try:
        return fn()
    finally:
        del _deadline.at


async def read_off_loop(body: dict, fn, timeout_s: float):
    """fn() reading a request: on the checks' thread, its schema checks bounded by `timeout_s`, when the body
    offers tools (their metaschema check is pure Python, ~0.5 ms a node); on the event loop otherwise."""
    if not body.get("tools"):
        return fn()

    def late():
        raise ApiError(
            400, f"checking the tool schemas took longer than tool_schema_timeout_s={timeout_s} s", param="tools"
        )

    return await off_loop(fn, timeout_s, late, kind="read")


async def off_loop(fn, timeout_s: float, on_timeout, kind: str = "call"):
    """fn() on a thread of `kind`'s pool (VALIDATION_THREADS) with its deadline, counted from when the thread
    takes it; on_timeout() if even the thread does not come back in time (a check stuck in one long C call):
    once started, the event loop never waits longer than the deadline and a second."""
    if kind not in _pools:
        _pools[kind] = ThreadPoolExecutor(VALIDATION_THREADS[kind], thread_name_prefix=f"tool-{kind}")
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def job():
        loop.call_soon_threadsafe(started.set)
        return run_bounded(fn, timeout_s)

    fut = loop.run_in_executor(_pools[kind], job)
    waiter = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait([fut, waiter], return_when=asyncio.FIRST_COMPLETED)  # queued: no deadline yet
        return await asyncio.wait_for(asyncio.shield(fut), timeout_s + 1.0)
    except asyncio.TimeoutError:
        return on_timeout()
    finally:
        waiter.cancel()
