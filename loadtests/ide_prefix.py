"""IDE traffic whose prompts share long prefixes: users editing files of thousands of tokens.

Each user edits a file of `file_tokens` tokens (a few users have a second file and switch between them).
Every request is a fill-in-the-middle completion at the cursor: the prompt is the file up to the cursor,
the suffix what follows it. Between requests the user types a line at the cursor (the text before the
cursor is unchanged, so the last prompt is a prefix of the next) and now and then moves the cursor
down. A replica that served the user's last request holds most of the next prompt in its prefix cache;
any other replica pays the prefill again.

The same traffic goes to either kind of endpoint, so routers can be compared on it:

    gateway   our OpenAI API: /v1/completions with `suffix`, streamed, usage with cached_tokens
    sglang    SGLang's native /generate with the fill-in-the-middle text (a replica, or a router in front
              of replicas such as smg), streamed, meta_info.cached_tokens

Measured per request: time to first token (first streamed chunk), prompt and cached tokens, end to end.
`summarize` gives the prefix hit rate (cached / prompt tokens), TTFT p50 and p99 and throughput.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import numpy as np
import orjson

from contracts import replica_keys

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
NAMES = ["total", "count", "value", "items", "result", "index", "data", "left", "right", "node", "key", "size"]
OPS = ["+", "-", "*", "//", "%"]


@dataclass
class IdeWorkloadConfig:
    users: int = 12
    file_tokens: tuple[int, int] = (2000, 6000)  # each file's length, drawn uniformly
    chars_per_token: float = 3.0  # of the synthetic code under the served tokenizer (measured by the caller)
    switching_share: float = 0.25  # of users with a second file
    switch_every: int = 6  # requests between their file switches
    suffix_chars: int = 300  # code after the cursor sent as the FIM suffix
    move_chance: float = 0.2  # the cursor jumps a few lines down instead of staying after the typed line
    think_s: float = 0.3  # mean pause between a user's requests (exponential)
    max_tokens: int = 8
    seed: int = 0


def _line(rng: random.Random, indent: int) -> str:
    a, b = rng.sample(NAMES, 2)
    expr = f"{b}_{rng.randrange(100)} {rng.choice(OPS)} {rng.randrange(1, 10)}"
    return f"{'    ' * indent}{a}_{rng.randrange(100)} = {expr}\n"


def synthetic_file(rng: random.Random, chars: int) -> str:
    """Python-shaped code of about `chars` characters: functions of assignments, loops and returns."""
    out, size = [], 0
    while size < chars:
        name = f"{rng.choice(NAMES)}_{rng.randrange(1000)}"
        block = [f"def {name}({', '.join(rng.sample(NAMES, 2))}):\n"]
        for _ in range(rng.randrange(3, 9)):
            if rng.random() < 0.2:
                block.append(f"    for {rng.choice(NAMES)} in range({rng.randrange(2, 20)}):\n")
                block.append(_line(rng, 2))
            else:
                block.append(_line(rng, 1))
        block.append(f"    return {rng.choice(NAMES)}_{rng.randrange(100)}\n\n")
        text = "".join(block)
        out.append(text)
        size += len(text)
    return "".join(out)


@dataclass
class Editor:
    """One user's files and cursor. The cursor is always at a line start (after a line break), where a
    prompt's tokens are stable: a line break is a token of its own under the served tokenizer."""

    files: list[str]
    cursor: list[int]
    current: int = 0
    requests: int = 0

    @classmethod
    def new(cls, rng: random.Random, cfg: IdeWorkloadConfig) -> Editor:
        n = 2 if rng.random() < cfg.switching_share else 1
        files = [synthetic_file(rng, int(rng.uniform(*cfg.file_tokens) * cfg.chars_per_token)) for _ in range(n)]
        cursors = [_line_start(f, int(len(f) * rng.uniform(0.3, 0.6))) for f in files]
        return cls(files, cursors)

    def request(self, cfg: IdeWorkloadConfig) -> tuple[str, str]:
        """(prefix, suffix) at the cursor."""
        text, at = self.files[self.current], self.cursor[self.current]
        return text[:at], text[at : at + cfg.suffix_chars]

    def edit(self, rng: random.Random, cfg: IdeWorkloadConfig) -> None:
        """Type a line at the cursor (or move down); switch files now and then."""
        i = self.current
        text, at = self.files[i], self.cursor[i]
        if rng.random() < cfg.move_chance:
            at = _line_start(text, at + rng.randrange(40, 400))
        else:
            typed = _line(rng, 1)
            text = text[:at] + typed + text[at:]
            at += len(typed)
        self.files[i], self.cursor[i] = text, min(at, len(text))
        self.requests += 1
        if len(self.files) > 1 and self.requests % cfg.switch_every == 0:
            self.current = (self.current + 1) % len(self.files)


def _line_start(text: str, at: int) -> int:
    nl = text.find("\n", min(at, len(text)))
    return len(text) if nl < 0 else nl + 1


@dataclass
class Sample:
    user: int
    started: float
    ttft_ms: float
    e2e_ms: float
    prompt_tokens: int
    cached_tokens: int | None


@dataclass
class Target:
    url: str
    kind: Literal["gateway", "sglang"]
    key: str | None = None  # the gateway's API key
    model: str = "flywheel-coder"
    engine_fields: dict = field(default_factory=dict)  # sglang: more /generate fields (what a gateway asks for)
    sampling_fields: dict = field(default_factory=dict)  # sglang: more sampling_params (stop tokens)
    user_keys: list[str] = field(default_factory=list)  # gateway: one API key per user (tenants), else `key`
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def one_request(
    s: aiohttp.ClientSession,
    t: Target,
    prefix: str,
    suffix: str,
    cfg: IdeWorkloadConfig,
    stream: bool = True,
    key: str | None = None,
):
    """(ttft_ms, e2e_ms, prompt_tokens, cached_tokens) of one completion (not streamed: ttft is e2e)."""
    if t.kind == "gateway":
        url, headers = f"{t.url}/v1/completions", {"Authorization": f"Bearer {key or t.key}"}
        body = {
            "model": t.model,
            "prompt": prefix,
            "suffix": suffix,
            "max_tokens": cfg.max_tokens,
            "temperature": 0.0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        url, headers = f"{t.url}/generate", replica_keys.inference_headers()
        body = {
            "text": f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}",
            "sampling_params": {"max_new_tokens": cfg.max_tokens, "temperature": 0.0, **t.sampling_fields},
            "stream": stream,
            **t.engine_fields,
        }
    t0 = time.monotonic()
    ttft, last = None, None
    async with s.post(url, json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {(await r.text())[:300]}")
        if not stream:
            last = orjson.loads(await r.read())
            ttft = 1000 * (time.monotonic() - t0)
        else:
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                if ttft is None:
                    ttft = 1000 * (time.monotonic() - t0)
                last = orjson.loads(line[6:])
    e2e = 1000 * (time.monotonic() - t0)
    if last is None:
        raise RuntimeError("no answer")
    if t.kind == "gateway":
        usage = last.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return ttft, e2e, usage.get("prompt_tokens", 0), cached
    meta = last.get("meta_info", {})
    return ttft, e2e, meta.get("prompt_tokens", 0), meta.get("cached_tokens")


async def run(target: Target, cfg: IdeWorkloadConfig, requests: int, warmup: int = 0) -> float:
    """Every user in a closed loop (request, think, edit) for warmup + requests requests; samples of the last
    `requests` only (caches start empty: the warm-up fills them). Every user sends the same prompts to any
    target, so targets are compared on identical traffic. Returns the seconds the measured part took
    (first measured request sent to last answered)."""
    rng = random.Random(cfg.seed)
    editors = [Editor.new(rng, cfg) for _ in range(cfg.users)]
    marks: list[float] = []

    async def user(u: int, s: aiohttp.ClientSession) -> None:
        urng = random.Random(cfg.seed * 1000 + u)
        key = target.user_keys[u % len(target.user_keys)] if target.user_keys else None
        await asyncio.sleep(urng.uniform(0, cfg.think_s))  # users do not start in step
        for i in range(warmup + requests):
            prefix, suffix = editors[u].request(cfg)
            t0 = time.monotonic()
            try:
                ttft, e2e, prompt, cached = await one_request(s, target, prefix, suffix, cfg, key=key)
                if i >= warmup:
                    target.samples.append(Sample(u, t0, ttft, e2e, prompt, cached))
                    marks.extend((t0, time.monotonic()))
            except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as e:
                target.errors.append(f"user {u}: {type(e).__name__}: {e}")
            editors[u].edit(urng, cfg)
            await asyncio.sleep(urng.expovariate(1 / cfg.think_s) if cfg.think_s else 0)

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(user(u, s) for u in range(cfg.users)))
    return max(marks) - min(marks) if marks else 0.0


def summarize(t: Target, seconds: float) -> dict:
    if not t.samples:
        return {"requests": 0, "errors": len(t.errors)}
    ttft = np.array([x.ttft_ms for x in t.samples])
    prompt = sum(x.prompt_tokens for x in t.samples if x.cached_tokens is not None)
    cached = sum(x.cached_tokens for x in t.samples if x.cached_tokens is not None)
    return {
        "requests": len(t.samples),
        "errors": len(t.errors),
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "e2e_p50_ms": round(float(np.percentile([x.e2e_ms for x in t.samples], 50)), 1),
        "requests_per_s": round(len(t.samples) / seconds, 2) if seconds else None,
        "mean_prompt_tokens": round(float(np.mean([x.prompt_tokens for x in t.samples])), 1),
    }
