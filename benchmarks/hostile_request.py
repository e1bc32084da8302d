"""Other tenants' latency while one hostile request is in flight on the same gateway (issue #48, item 2).

A gateway in this process in front of a stand-in replica (tests.fake_engine: it writes the text a scenario
gives it, so what the "model" writes is known). From threads outside the gateway's event loop, /health and
a plain chat completion of another tenant are timed over and over, first with nothing else in flight, then
while a hostile request is:
- ref_fanout: a tool schema whose check expands $ref fan-out (an anyOf of two refs to the next level,
  LEVELS deep: 2^LEVELS steps for a failing value), the model's call failing it;
- slow_pattern: a schema under every static bound whose check still runs a pathological pattern to its time
  limit for each of 40 list items (serving.protocol.tool_schema: now off the event loop, to a deadline).

    python -m benchmarks.hostile_request                 (LEVELS=40; on code without the expansion bound
    HOSTILE_LEVELS=18 python -m benchmarks.hostile_request    a smaller one: 2^40 would never finish)

Prints one JSON object: per scenario the hostile request's status and seconds, and the probes' p50 / max
latency (ms) with how many were answered while it was in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from online_rl.model.bootstrap import bootstrap
from tests.fake_engine import gateway_over_fakes

LEVELS = int(os.environ.get("HOSTILE_LEVELS", "40"))
USER = [{"role": "user", "content": "fix the bug"}]
PREFILL_ARGS = '{"name": "f", "arguments": '


def _ref_fanout(levels: int) -> dict:
    defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(levels)}
    defs[f"a{levels}"] = {"type": "string"}
    return {"$defs": defs, "type": "object", "properties": {"p": {"$ref": "#/$defs/a0"}}}


SLOW = {
    "type": "object",
    "properties": {
        "xs": {"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "^(a|aa)+$"}, {"type": "string"}]}}
    },
}
SCENARIOS = {  # name: (the tool's schema, the arguments the model writes, closing the call)
    "ref_fanout": (_ref_fanout(LEVELS), '{"p": 1}}\n</tool_call>'),
    "slow_pattern": (SLOW, json.dumps({"xs": ["a" * 40 + "!"] * 40}) + "}\n</tool_call>"),
}


def _get(url: str) -> None:
    try:
        urllib.request.urlopen(url, timeout=120).read()
    except urllib.error.HTTPError:
        pass  # a 503 is an answer too


def _chat(url: str) -> None:
    body = json.dumps({"model": "flywheel-coder", "messages": USER, "max_tokens": 8}).encode()
    headers = {"Authorization": "Bearer key-u1", "Content-Type": "application/json"}
    urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=120).read()


def _probe(fn, url: str, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        t = time.monotonic()
        fn(url)
        out.append((t, time.monotonic()))
        time.sleep(0.02)


def _summary(samples: list, start: float, end: float) -> dict:
    lat = [(a - s) * 1e3 for s, a in samples if s >= start and s < end]
    return {
        "answered": len(lat),
        "p50_ms": round(statistics.median(lat), 1) if lat else None,
        "max_ms": round(max(lat), 1) if lat else None,
    }


async def _run(model: Path, state: Path) -> dict:
    out: dict = {"levels": LEVELS}
    async with gateway_over_fakes(model, state, [1]) as (client, fakes):
        url = str(client.make_url("")).rstrip("/")
        answers: list[str] = []
        tok = client.gateway.prompter.tok
        # the hostile request's prompt offers the tool; the probes' prompts do not
        fakes[0].script = lambda ids: answers.pop(0) if answers and "# tools:" in tok.decode(ids) else "x = 1"
        stop = threading.Event()
        health: list = []
        chats: list = []
        probes = [
            threading.Thread(target=_probe, args=(_get, url + "/health", stop, health), daemon=True),
            threading.Thread(target=_probe, args=(_chat, url + "/v1/chat/completions", stop, chats), daemon=True),
        ]
        for p in probes:
            p.start()
        t0 = time.monotonic()
        await asyncio.sleep(3.0)
        out["idle"] = {"health": _summary(health, t0, time.monotonic()), "chat": _summary(chats, t0, time.monotonic())}
        for name, (schema, args) in SCENARIOS.items():
            body = {
                "model": "flywheel-coder",
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "max_tokens": 64,
            }
            answers.insert(0, args)
            t = time.monotonic()
            r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer key-u0"})
            text = await r.text()
            end = time.monotonic()
            if answers and answers[0] == args:
                answers.pop(0)  # refused before the model was asked
            finish = json.loads(text)["choices"][0]["finish_reason"] if r.status == 200 else text[:160]
            await asyncio.sleep(1.0)  # the probes sent while it ran come back
            out[name] = {
                "status": r.status,
                "answer": finish,
                "hostile_s": round(end - t, 2),
                "health": _summary(health, t, end),
                "chat": _summary(chats, t, end),
            }
        stop.set()
        loop = asyncio.get_running_loop()
        for p in probes:
            await loop.run_in_executor(None, p.join, 130)
    return out


def main() -> None:
    model = bootstrap("test", seed=0, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(_run(model, Path(tmp) / "gw"))))


if __name__ == "__main__":
    main()
