"""Client for one SGLang replica's native /generate API (token ids in, tokens + logprobs + experts out)."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import AsyncIterator

import aiohttp
import numpy as np
import orjson

from contracts import events as ev


class EngineUnavailable(Exception):
    """The replica failed before answering (connection refused, reset, 5xx before the first byte)."""


class EngineError(Exception):
    """The replica answered with an error for this request."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ReplicaBroke(EngineError):
    """The replica failed after output had started (connection lost, timed out): the request cannot move
    to another replica, and the replica is suspect."""

    def __init__(self, message: str):
        super().__init__(502, message)


@dataclass
class EngineResult:
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    routed_experts: np.ndarray | None = None  # (P + N - 1, L, K) uint8
    finish: dict | None = None
    weight_version: int | None = None  # of the first output token; None: the replica did not say
    weight_versions: list = field(default_factory=list)  # [{version: int, start, end}]
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # prompt tokens the replica's prefix cache already held (None: not said)
    queue_ms: float = 0.0

    @property
    def latest_version(self) -> int | None:
        """The version that made the last token: what the replica serves now, as far as this answer knows."""
        last = next((s["version"] for s in reversed(self.weight_versions) if s["version"] is not None), None)
        return last if last is not None else self.weight_version


def payload(input_ids: list[int], sampling: dict, top_logprobs: int, stream: bool, rid: str) -> dict:
    return {
        "input_ids": input_ids,
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": top_logprobs,
        "return_routed_experts": True,
        "stream": stream,
        "rid": rid,
    }


def _experts(meta: dict, layers: int, top_k: int) -> np.ndarray | None:
    raw = meta.get("routed_experts")
    if not raw:
        return None
    a = np.frombuffer(base64.b64decode(raw), dtype=np.int32)
    return a.reshape(-1, layers, top_k).astype(np.uint8)


def _fill(result: EngineResult, out: dict, layers: int, top_k: int) -> None:
    meta = out.get("meta_info", {})
    result.output_ids = list(out.get("output_ids", []))
    result.text = out.get("text", "")
    result.logprobs = [lp for lp, _, _ in meta.get("output_token_logprobs", [])]
    tops = meta.get("output_top_logprobs")
    if tops:
        result.top_logprobs = [{tid: lp for lp, tid, _ in row} for row in tops]
    result.finish = meta.get("finish_reason")
    result.weight_versions = ev._spans(meta.get("weight_versions", []))
    # meta's weight_version is the replica's version when this chunk left it, not the one that made the
    # tokens: across a switch the first chunk could say v3 of tokens made by v1. The spans are the truth.
    first = next((s["version"] for s in result.weight_versions if s["version"] is not None), None)
    result.weight_version = first if first is not None else ev.parse_version(meta.get("weight_version"))
    result.prompt_tokens = meta.get("prompt_tokens", 0)
    cached = meta.get("cached_tokens")
    result.cached_tokens = cached if type(cached) is int else None
    result.queue_ms = 1000 * (meta.get("queue_time") or 0.0)
    experts = _experts(meta, layers, top_k)
    if experts is not None:
        result.routed_experts = experts


# What a malformed answer raises as it is read (not JSON, not an object, fields of the wrong type or shape).
_MALFORMED = (ValueError, TypeError, AttributeError, KeyError, IndexError)


def _parse(data: bytes, result: EngineResult, layers: int, top_k: int) -> dict:
    """One answer (or stream chunk) read into result; raises one of _MALFORMED if it is not what SGLang sends."""
    out = orjson.loads(data)
    if not isinstance(out, dict):
        raise TypeError(f"an answer is a JSON object, not {type(out).__name__}")
    if "error" not in out:
        _fill(result, out, layers, top_k)
    return out


def _message(err) -> str:
    """The message of an error SGLang sends in an answer's body ({"message": ...}, or a bare string)."""
    return str(err.get("message", err) if isinstance(err, dict) else err)[:500]


async def _error(resp: aiohttp.ClientResponse) -> Exception:
    text = await resp.text()
    try:
        msg = json.loads(text).get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        msg = text
    if resp.status >= 500:
        return EngineUnavailable(f"replica answered {resp.status}: {msg[:300]}")
    return EngineError(resp.status, str(msg)[:500])


async def generate(
    session: aiohttp.ClientSession, url: str, body: dict, layers: int, top_k: int, timeout_s: float
) -> EngineResult:
    try:
        async with session.post(f"{url}/generate", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                raise await _error(r)
            data = await r.read()
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:  # the latter: a body cut short
        raise EngineUnavailable(f"{type(e).__name__}: {e}") from None
    except asyncio.TimeoutError:
        raise EngineUnavailable(f"no answer within {timeout_s:g} s") from None
    result = EngineResult()
    try:  # a replica answering garbage is a failed replica (another one takes the request), never a 500
        out = _parse(data, result, layers, top_k)
    except _MALFORMED as e:
        raise EngineUnavailable(f"malformed answer ({type(e).__name__}: {str(e)[:200]})") from None
    if "error" in out:
        raise EngineError(400, _message(out["error"]))
    return result


async def generate_stream(
    session: aiohttp.ClientSession, url: str, body: dict, layers: int, top_k: int, timeout_s: float
) -> AsyncIterator[tuple[str, EngineResult]]:
    """Yields (new_text, cumulative result) per chunk. EngineUnavailable only before the first chunk."""
    result = EngineResult()
    got_first = False
    try:
        async with session.post(
            f"{url}/generate",
            json=body,
            # Idle time only: a long stream that keeps sending is not a hung replica.
            timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s),
        ) as r:
            if r.status != 200:
                raise await _error(r)
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                before = len(result.text)
                try:
                    out = _parse(data, result, layers, top_k)
                except _MALFORMED as e:  # before any output another replica takes it; after, the stream broke
                    why = f"malformed chunk ({type(e).__name__}: {str(e)[:200]})"
                    raise (
                        ReplicaBroke(f"replica stream broke: {why}") if got_first else EngineUnavailable(why)
                    ) from None
                if "error" in out:
                    raise EngineError(400, _message(out["error"]))
                got_first = True
                yield result.text[before:], result
    # A replica that dies mid-answer cuts the chunked body short (ClientPayloadError), or the connection.
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as e:
        why = f"no answer within {timeout_s:g} s" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
        if got_first:
            raise ReplicaBroke(f"replica stream broke: {why}") from None
        raise EngineUnavailable(why) from None
