"""Tool schemas' checks off the event loop (serving.protocol.tool_schema): the threads of schema reads and of call
checks apart, a queued job's deadline from its start, and scopes the fan-out count could not follow refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.protocol.openai import Limits, parse_chat
from serving.protocol.schema import ApiError

USER = [{"role": "user", "content": "fix the bug"}]


def tool(params: dict, name: str = "f") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def test_schema_reads_never_hold_up_call_checks_and_a_queued_job_is_not_late():
    """A flood of costly schema reads fills the read threads: the model's calls are still checked at once
    (their own threads), and a read that waited in the queue longer than its deadline still gets its whole
    deadline once started (waiting is latency, not a 400)."""

    from serving.protocol import tool_schema as ts

    async def main():
        slow = [ts.off_loop(lambda: time.sleep(1.5) or "read", 2.0, lambda: "late", kind="read") for _ in range(3)]
        reads = [asyncio.ensure_future(r) for r in slow]
        await asyncio.sleep(0.05)  # both read threads busy, the third read queued
        t = time.monotonic()
        call = await ts.off_loop(lambda: "checked", 0.2, lambda: "late", kind="call")
        call_s = time.monotonic() - t
        queued = await ts.off_loop(lambda: time.sleep(0.05) or "read", 0.2, lambda: "late", kind="read")
        return call, call_s, queued, await asyncio.gather(*reads)

    call, call_s, queued, reads = asyncio.run(main())
    assert call == "checked" and call_s < 1.0, call_s  # not behind the reads (they hold their threads 1.5 s)
    # queued ~1.45 s behind the reads, past its deadline and the second of grace: still not late
    assert queued == "read"
    assert reads == ["read"] * 3


@pytest.mark.parametrize("key", ["$id", "$anchor", "$dynamicAnchor"])
def test_a_new_scope_below_the_root_is_refused(key):
    """jsonschema resolves a $ref under a nested $id against that $id's resource, where the expansion count
    (which resolves from the root) would not follow: a cheap-looking ref could be an expensive one."""
    cheap = {"type": "string"}
    nested = {key: "urn:x" if key == "$id" else "a", "$defs": {"a": cheap}, "anyOf": [{"$ref": "#/$defs/a"}]}
    params = {"type": "object", "$defs": {"a": cheap}, "properties": {"x": nested}}
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "m", "messages": USER, "tools": [tool(params)]}, Limits())
    assert e.value.status == 400 and key in e.value.message


def test_a_dynamic_ref_is_refused():
    params = {"type": "object", "properties": {"x": {"$dynamicRef": "#meta"}}}
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "m", "messages": USER, "tools": [tool(params)]}, Limits())
    assert e.value.status == 400 and "$dynamicRef" in e.value.message
