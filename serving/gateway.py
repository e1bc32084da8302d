"""The Flywheel gateway: an OpenAI-compatible API in front of SGLang replicas (aiohttp).

    client --HTTP--> auth -> validate -> tokenize -> pick replica (least outstanding) -> /generate
                                                   <- tokens, logprobs, routed experts, weight version
           <-- OpenAI response (+ completion id, model version) --'  '--> completion event -> event log

Feedback (`/v1/feedback`, Tabby's `/v1/events`) becomes feedback events keyed by the same completion id.
Events go through serving.event_log: the request path never waits on Kafka.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from flywheel.core import events as ev, tool_format as tf
from serving import engine, tool_calls as tc
from serving.auth import CompletionIds, KeyStore, Tenant, admin_ok, bearer, load_or_create_secret
from serving.canary_split import CanarySplit
from serving.event_log import EventLog, EventLogConfig
from serving.first_feedback import FirstFeedback
from serving.metrics import GatewayMetrics
from serving.openai_api import (
    ApiError,
    GenerationSpec,
    Limits,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from serving.router import Lease, NoReplica, PoolConfig, ReplicaPool, ReplicaState
from serving.sessions import MAX_SESSION_ID, Sessions

log = logging.getLogger(__name__)

VERSION_HEADER = "X-Flywheel-Model-Version"
SESSION_HEADER = "X-Session-Id"  # an agent session's id, from the client (else derived: serving.sessions)
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, EOS = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"


@dataclass
class GatewayConfig:
    replicas: list[str] = field(default_factory=list)
    model_dir: Path | None = None  # tokenizer.json + config.json of the served model
    model_name: str = "flywheel-coder"
    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: Path = Path("gateway-state")  # event spool, id secret
    keys_file: Path | None = None
    api_keys: str | None = None  # "name:key,..." (FLYWHEEL_API_KEYS)
    admin_token: str | None = None  # FLYWHEEL_ADMIN_TOKEN
    kafka_bootstrap: str | None = None  # FLYWHEEL_KAFKA_BOOTSTRAP; None: events stay in the spool
    log_events: bool = True
    limits: Limits = field(default_factory=Limits)
    pool: PoolConfig = field(default_factory=PoolConfig)
    request_timeout_s: float = 300.0
    max_attempts: int = 3  # replicas tried for one request that fails before its first byte
    max_spool_bytes: int = 1 << 30
    # A response waits (at most this long) until its completion or feedback event is on disk, so a gateway
    # that crashes never loses an event its client was answered for. Past it (disk full, failing) the
    # response goes out anyway, counted: serving does not stop for the spool.
    durable_wait_s: float = 2.0

    @classmethod
    def from_env(cls, **overrides) -> "GatewayConfig":
        cfg = cls(**overrides)
        cfg.api_keys = cfg.api_keys or os.environ.get("FLYWHEEL_API_KEYS")
        cfg.admin_token = cfg.admin_token or os.environ.get("FLYWHEEL_ADMIN_TOKEN")
        cfg.kafka_bootstrap = cfg.kafka_bootstrap or os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP")
        return cfg


class ClientGone(Exception):
    """The client closed its connection mid-stream (IDE clients cancel all the time)."""


class Gateway:
    def __init__(self, cfg: GatewayConfig):
        from tokenizers import Tokenizer

        if not cfg.replicas:
            raise ValueError("the gateway needs at least one replica URL")
        if cfg.model_dir is None:
            raise ValueError("the gateway needs the model dir (for its tokenizer and config)")
        self.cfg = cfg
        self.tok = Tokenizer.from_file(str(Path(cfg.model_dir) / "tokenizer.json"))
        model_cfg = json.loads((Path(cfg.model_dir) / "config.json").read_text())
        self.layers, self.top_k = model_cfg["num_hidden_layers"], model_cfg["num_experts_per_tok"]
        self.cfg.limits.context_tokens = min(cfg.limits.context_tokens, model_cfg["max_position_embeddings"])
        # Control tokens end a plain completion: the model must not wander into fill-in-the-middle syntax.
        self.stop_token_ids = sorted(
            i for t in (EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE) if (i := self.tok.token_to_id(t)) is not None
        )
        # No token stands for more bytes than this (a text has at least bytes / this many tokens).
        self.max_token_bytes = max(
            len(self.tok.decode([i], skip_special_tokens=False).encode()) for i in range(self.tok.get_vocab_size())
        )
        self._background: set[asyncio.Task] = set()  # aborts sent to replicas, kept until done
        self.keys = KeyStore.load(cfg.keys_file, cfg.api_keys)
        state = Path(cfg.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.ids = CompletionIds(load_or_create_secret(state / "id_secret"))
        self.first_feedback = FirstFeedback()
        self.first_session_feedback = FirstFeedback(capacity=200_000)
        self.sessions = Sessions()
        self._durable: collections.deque = collections.deque()  # futures on disk, for the loop to resolve
        self.pool = ReplicaPool(cfg.replicas, cfg.pool)
        self.canary: CanarySplit | None = None  # a trial in progress (weight_sync.canary starts and ends it)
        self.events = EventLog(
            EventLogConfig(
                spool_dir=state / "spool", bootstrap=cfg.kafka_bootstrap, max_spool_bytes=cfg.max_spool_bytes
            )
        )
        self.metrics = GatewayMetrics(self)
        self.session: aiohttp.ClientSession | None = None
        self.app = self._build_app()

    # ------------------------------------------------------------------ app
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.limits.max_body_bytes, middlewares=[self._errors])
        app.add_routes(
            [
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
                web.post("/v1/feedback", self.feedback),
                web.post("/v1/events", self.tabby_events),
                web.get("/health", self.health),
                web.get("/metrics", self.prometheus),
                web.get("/admin/replicas", self.admin_replicas),
                web.post("/admin/replicas/{replica}/{action}", self.admin_replica_action),
                web.get("/admin/weights", self.admin_weights),
                web.post("/admin/rollouts", self.admin_rollouts),
                web.get("/admin/load", self.admin_load),
                web.get("/admin/canary", self.admin_canary),
                web.put("/admin/canary", self.admin_canary_start),
                web.delete("/admin/canary", self.admin_canary_end),
            ]
        )
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(connector=connector)
        if self.cfg.log_events:
            loop = asyncio.get_running_loop()
            self.events.after_sync = lambda: self._wake_durable(loop)
            self.events.start()
        await self.pool.start(self.session)

    async def _cleanup(self, app) -> None:
        await self.pool.stop()
        if self.session:
            await self.session.close()
        if self.cfg.log_events:
            await asyncio.get_running_loop().run_in_executor(None, self.events.close, 10.0)

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            resp = await handler(request)
        except ApiError as e:
            resp = _error_response(e)
        except web.HTTPException as e:  # aiohttp's own: 404 no route, 405 method, 413 body too large
            if e.status < 400:
                raise
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
            resp = _error_response(ApiError(e.status, e.reason or "error", kind, code=code))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            resp = _error_response(ApiError(500, "internal error", "server_error", code="internal_error"))
        self.metrics.requests.labels(route, str(resp.status)).inc()
        return resp

    # ------------------------------------------------------------------ auth helpers
    def _tenant(self, request: web.Request) -> Tenant:
        key = bearer(request.headers.get("Authorization")) or request.headers.get("X-Api-Key")
        tenant = self.keys.lookup(key)
        if tenant is None:
            raise ApiError(
                401,
                "Incorrect API key provided" if key else "Missing API key: send Authorization: Bearer <key>",
                "authentication_error",
                code="invalid_api_key",
            )
        return tenant

    def _admin(self, request: web.Request) -> None:
        if not admin_ok(bearer(request.headers.get("Authorization")), self.cfg.admin_token):
            raise ApiError(
                401, "admin endpoints need the admin token", "authentication_error", code="invalid_admin_token"
            )

    # ------------------------------------------------------------------ generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request)
        spec = parse_completion(parse_json_body(await request.read()), self.cfg.limits)
        return await self._generate(request, tenant, spec)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request)
        spec = parse_chat(parse_json_body(await request.read()), self.cfg.limits)
        given = request.headers.get(SESSION_HEADER) or spec.session_hint
        if given is not None and (
            not given.isascii() or not given.isprintable() or not 0 < len(given) <= MAX_SESSION_ID
        ):
            raise ApiError(
                400,
                f"a session id is 1-{MAX_SESSION_ID} printable ASCII characters",
                param="session_id",
                code="invalid_value",
            )
        if given is not None and given.startswith("cmpl-"):  # our ids' shape: only one we issued to this key
            try:
                self._check_owner(tenant, given)
            except ApiError:
                raise ApiError(
                    400,
                    "a session id that starts with 'cmpl-' must be one this server derived for "
                    "this API key (name your own sessions otherwise)",
                    param="session_id",
                    code="invalid_value",
                ) from None
        spec.session_hint = given
        return await self._generate(request, tenant, spec)

    async def _prompt_ids(self, spec: GenerationSpec) -> list[int]:
        text = spec.prompt if spec.suffix is None else f"{FIM_PREFIX}{spec.prompt}{FIM_SUFFIX}{spec.suffix}{FIM_MIDDLE}"
        lim = self.cfg.limits
        # Too long to fit whatever its tokens: refused without tokenizing (up to a MiB of text would hold
        # this event loop, and every tenant on it, for as long as that takes).
        if len(text) > lim.max_prompt_tokens * self.max_token_bytes:
            raise ApiError(
                400,
                f"prompt is {len(text)} characters, more than {lim.max_prompt_tokens} tokens can "
                f"hold; the limit is {lim.max_prompt_tokens} tokens",
                param="prompt",
                code="context_length_exceeded",
            )
        if len(text) > 4096:  # long enough to be worth a thread (the tokenizer releases the GIL)
            ids = (await asyncio.get_running_loop().run_in_executor(None, self.tok.encode, text)).ids
        else:
            ids = self.tok.encode(text).ids
        if len(ids) > lim.max_prompt_tokens:
            raise ApiError(
                400,
                f"prompt is {len(ids)} tokens; the limit is {lim.max_prompt_tokens}",
                param="prompt",
                code="context_length_exceeded",
            )
        if len(ids) + spec.max_tokens > lim.context_tokens:
            raise ApiError(
                400,
                f"prompt ({len(ids)} tokens) plus max_tokens ({spec.max_tokens}) exceeds the "
                f"model's context of {lim.context_tokens} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return ids

    def _sampling(self, spec: GenerationSpec) -> dict:
        stop = list(spec.stop)
        if spec.tools is not None and spec.tools.active and spec.tools.single:
            stop.append(tf.CALL_CLOSE)  # one call and done (SGLang trims it: _trimmed_stop puts it back)
        s = {
            "max_new_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "stop": stop or None,
            "stop_token_ids": self.stop_token_ids,
            "presence_penalty": spec.presence_penalty,
            "frequency_penalty": spec.frequency_penalty,
        }
        if spec.seed is not None:
            s["sampling_seed"] = spec.seed
        if spec.min_tokens:
            s["min_new_tokens"] = spec.min_tokens
        return s

    def _pick(self, tried: set[str], rollout: bool, borrowed_only: bool = False, tenant: str | None = None):
        if not rollout:
            prefer = None
            if self.canary is not None and tenant is not None:  # a user stays on its arm during a trial
                ids = set(self.pool.replicas)
                prefer = (
                    self.canary.replicas
                    if self.canary.arm_of(tenant) == "canary"
                    else frozenset(ids - self.canary.replicas)
                )
            return self.pool.pick(exclude=tried, prefer=prefer)
        try:  # rollouts go to borrowed replicas; without an off-peak scheduler lending some, to any replica
            return self.pool.pick(exclude=tried, rollout=True)
        except NoReplica:
            if borrowed_only:
                raise
            return self.pool.pick(exclude=tried)

    async def _run_choice(
        self,
        body: dict,
        stream: bool,
        on_chunk=None,
        rollout: bool = False,
        borrowed_only: bool = False,
        tenant: str | None = None,
    ) -> tuple[engine.EngineResult, str, dict]:
        """One choice on one replica; retried on another if the replica fails before its first byte."""
        tried: set[str] = set()
        last: Exception | None = None
        for attempt in range(self.cfg.max_attempts):
            try:
                replica = self._pick(tried, rollout, borrowed_only, tenant)
            except NoReplica as e:
                last = e
                break
            tried.add(replica.id)
            if attempt:
                self.metrics.retries.inc()
            t0 = time.monotonic()
            timing = {"ttft_ms": None}
            try:
                with Lease(replica, rollout=rollout):
                    if rollout:
                        replica.rollout_rids.add(body["rid"])
                    try:
                        if not stream:
                            res = await engine.generate(
                                self.session, replica.url, body, self.layers, self.top_k, self.cfg.request_timeout_s
                            )
                        else:
                            res = None
                            async for delta, res in engine.generate_stream(
                                self.session, replica.url, body, self.layers, self.top_k, self.cfg.request_timeout_s
                            ):
                                if timing["ttft_ms"] is None:
                                    timing["ttft_ms"] = 1000 * (time.monotonic() - t0)
                                await on_chunk(delta, res)
                            if res is None:
                                raise engine.EngineUnavailable("stream ended before any output")
                    finally:
                        replica.rollout_rids.discard(body["rid"])
            except engine.EngineUnavailable as e:  # before any output: another replica takes it
                self.pool.mark_failed(replica, str(e))
                self._abort_soon(replica, body["rid"])  # a replica that timed out may still be generating
                last = e
                continue
            except engine.ReplicaBroke as e:  # after output started: the request fails, the replica is out
                self.pool.mark_failed(replica, str(e))
                self._abort_soon(replica, body["rid"])
                raise ApiError(502, f"engine: {e}", "server_error", code="replica_failed") from None
            except (ClientGone, asyncio.CancelledError):
                self._abort_soon(replica, body["rid"])  # nobody reads it any more: free the replica
                raise
            except engine.EngineError as e:
                raise ApiError(
                    400 if e.status < 500 else 502,
                    f"engine: {e}",
                    "invalid_request_error" if e.status < 500 else "server_error",
                ) from None
            replica.served += 1
            if res.weight_version is not None:
                replica.weight_version = res.weight_version
            timing["e2e_ms"] = 1000 * (time.monotonic() - t0)
            return res, replica.id, timing
        if self.canary is not None and tenant is not None:
            self.canary.failed(tenant)
        raise ApiError(503, f"no replica could serve the request ({last})", "server_error", code="no_replica")

    async def _generate(self, request: web.Request, tenant: Tenant, spec: GenerationSpec) -> web.StreamResponse:
        prompt_ids = await self._prompt_ids(spec)
        cid = self.ids.issue(tenant)
        if spec.kind == "chat":
            spec.session = self.sessions.link(tenant.id, spec.messages, spec.session_hint, cid)
        sampling = self._sampling(spec)
        top_n = spec.logprobs or 0
        bodies = [engine.payload(prompt_ids, sampling, top_n, spec.stream, f"{cid}-{i}") for i in range(spec.n)]
        created = int(time.time())
        if spec.stream:
            return await self._stream(request, tenant, spec, cid, prompt_ids, bodies, created)
        t0 = time.monotonic()
        results = await asyncio.gather(*(self._run_choice(b, False, tenant=tenant.id) for b in bodies))
        choices = []
        durable = []
        for i, (res, replica_id, timing) in enumerate(results):
            durable.append(self._log_completion(tenant, spec, cid, i, prompt_ids, res, replica_id, timing))
            choices.append(self._choice(spec, i, res, tenant, cid, replica_id))
            if spec.session is not None:
                m = choices[-1]["message"]
                self._remember(tenant, spec, cid, i, m["content"], m.get("tool_calls", []))
        await self._wait_durable(durable, ev.TOPIC_COMPLETIONS)
        version = results[0][0].weight_version
        completion_tokens = sum(len(r.output_ids) for r, _, _ in results)
        body = {
            "id": cid,
            "object": "text_completion" if spec.kind == "completion" else "chat.completion",
            "created": created,
            "model": spec.model,
            "choices": choices,
            "model_version": version,
            "system_fingerprint": _fingerprint(version),
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }
        headers = {VERSION_HEADER: "" if version is None else str(version)}
        if spec.session is not None:
            body["session_id"] = headers[SESSION_HEADER] = spec.session.session_id
        self.metrics.e2e.labels(request.path).observe(time.monotonic() - t0)
        return _json(body, headers=headers)

    def _remember(
        self, tenant: Tenant, spec: GenerationSpec, cid: str, i: int, content: str | None, calls: list[dict]
    ) -> None:
        """An answer, as the client will send it back next turn (serving.sessions)."""
        answer = {
            "role": "assistant",
            "content": content or "",
            "calls": [
                {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls
            ],
        }
        self.sessions.record(tenant.id, spec.messages, answer, f"{cid}:{i}", spec.session.session_id)

    def _token_strings(self, ids: list[int]) -> list[str]:
        return [self.tok.decode([i], skip_special_tokens=False) for i in ids]

    def _logprobs(self, spec: GenerationSpec, res: engine.EngineResult) -> dict | None:
        if spec.logprobs is None:
            return None
        tokens = self._token_strings(res.output_ids)
        tops = None
        if spec.logprobs and res.top_logprobs:
            tops = [
                {self.tok.decode([tid], skip_special_tokens=False): lp for tid, lp in row.items()}
                for row in res.top_logprobs
            ]
        if spec.kind == "completion":
            return completion_logprobs(tokens, res.logprobs, tops, len(spec.prompt))
        return chat_logprobs(tokens, res.logprobs, tops)

    def _choice(
        self, spec: GenerationSpec, i: int, res: engine.EngineResult, tenant: Tenant, cid: str, replica_id: str
    ) -> dict:
        fr = finish_reason(res.finish)
        if spec.kind == "completion":
            return {"index": i, "text": res.text, "logprobs": self._logprobs(spec, res), "finish_reason": fr}
        message = {"role": "assistant", "content": res.text}
        if spec.tools is not None and spec.tools.active:
            parsed = self._tool_outcome(
                tc.parse(spec.prefill + res.text + _trimmed_stop(res), spec.tools),
                spec,
                tenant,
                cid,
                i,
                res,
                replica_id,
            )
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"], fr = parsed.calls, "tool_calls"
            elif parsed.outcome != "none" and fr != "length":
                fr = "stop"  # a call the model got wrong comes back as its text (a cut-off one says length)
        return {"index": i, "message": message, "logprobs": self._logprobs(spec, res), "finish_reason": fr}

    def _tool_outcome(
        self,
        parsed: tc.Parsed,
        spec: GenerationSpec,
        tenant: Tenant,
        cid: str,
        i: int,
        res: engine.EngineResult,
        replica_id: str,
    ) -> tc.Parsed:
        """Counts an answer's calls by outcome and by the version that wrote them, the calls repeating an
        earlier one of the session, and, during a canary trial, the tool answer on its arm."""
        if parsed.outcome == "none":
            return parsed
        repeated = 0
        if parsed.calls and spec.session is not None:
            repeated = self.sessions.repeated_calls(tenant.id, spec.session.session_id, parsed.calls, cid, i)
        self.metrics.tools.count(res.weight_version, parsed.outcome, max(1, len(parsed.calls)), repeated)
        if self.canary is not None:
            self.canary.tool_answer(replica_id, parsed.outcome in tc.MALFORMED, repeated > 0)
        return parsed

    async def _stream(self, request, tenant, spec, cid, prompt_ids, bodies, created) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                VERSION_HEADER: self.pool_version(),
                **({SESSION_HEADER: spec.session.session_id} if spec.session else {}),
            }
        )
        obj = "text_completion" if spec.kind == "completion" else "chat.completion.chunk"
        t0 = time.monotonic()
        last_chunk = [None]
        write_lock = asyncio.Lock()
        started = [False]

        async def send(payload: dict | bytes) -> None:
            async with write_lock:
                try:
                    if not started[0]:
                        await resp.prepare(request)
                        started[0] = True
                    await resp.write(
                        payload if isinstance(payload, bytes) else b"data: " + orjson.dumps(payload) + b"\n\n"
                    )
                except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
                    raise ClientGone() from None

        def chunk(i: int, text: str, fr: str | None, res=None, first=False, calls=None) -> dict:
            version = res.weight_version if res is not None else None
            if spec.kind == "completion":
                c = {"index": i, "text": text, "logprobs": None, "finish_reason": fr}
            else:
                delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                if calls is not None:
                    delta = {"tool_calls": calls}
                c = {"index": i, "delta": delta, "logprobs": None, "finish_reason": fr}
            out = {
                "id": cid,
                "object": obj,
                "created": created,
                "model": spec.model,
                "model_version": version,
                "system_fingerprint": _fingerprint(version),
                "choices": [c],
            }
            if spec.session is not None:
                out["session_id"] = spec.session.session_id
            return out

        async def run(i: int, body: dict):
            first = [True]
            # With tools, text that may be a call is held back until the answer is whole (serving.tool_calls).
            split = (
                tc.StreamSplitter(spec.tools, spec.prefill) if spec.tools is not None and spec.tools.active else None
            )

            async def on_chunk(delta: str, res: engine.EngineResult) -> None:
                now = time.monotonic()
                if first[0]:
                    self.metrics.ttft.labels(request.path).observe(now - t0)
                elif last_chunk[0] is not None:
                    self.metrics.itl.labels(request.path).observe(now - last_chunk[0])
                last_chunk[0] = now
                if split is not None:
                    delta = split.feed(delta)
                if delta or first[0]:
                    await send(chunk(i, delta, None, res, first[0]))
                first[0] = False

            res, replica_id, timing = await self._run_choice(body, True, on_chunk, tenant=tenant.id)
            fr = finish_reason(res.finish)
            if split is not None:
                tail = split.feed(_trimmed_stop(res))
                rest, parsed = split.finish()
                rest = tail + rest
                self._tool_outcome(parsed, spec, tenant, cid, i, res, replica_id)
                if rest:
                    await send(chunk(i, rest, None, res))
                for k, call in enumerate(parsed.calls):  # OpenAI's shape: the call's id and name, then its arguments
                    await send(
                        chunk(
                            i,
                            "",
                            None,
                            res,
                            calls=[
                                {
                                    "index": k,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["function"]["name"], "arguments": ""},
                                }
                            ],
                        )
                    )
                    await send(
                        chunk(
                            i,
                            "",
                            None,
                            res,
                            calls=[{"index": k, "function": {"arguments": call["function"]["arguments"]}}],
                        )
                    )
                fr = "tool_calls" if parsed.calls else ("stop" if parsed.outcome != "none" and fr != "length" else fr)
                if spec.session is not None:
                    self._remember(tenant, spec, cid, i, parsed.content, parsed.calls)
            elif spec.session is not None:
                self._remember(tenant, spec, cid, i, res.text, [])
            await send(chunk(i, "", fr, res))
            durable.append(self._log_completion(tenant, spec, cid, i, prompt_ids, res, replica_id, timing))
            return res

        durable: list = []

        tasks = [asyncio.ensure_future(run(i, b)) for i, b in enumerate(bodies)]
        try:
            try:
                results = await asyncio.gather(*tasks)
            finally:  # one choice failed or the client left: the others stop too (and abort on their replicas)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._wait_durable(durable, ev.TOPIC_COMPLETIONS)  # before [DONE]: the client's sign it is whole
            if spec.include_usage:
                completion_tokens = sum(len(r.output_ids) for r in results)
                await send(
                    {
                        "id": cid,
                        "object": obj,
                        "created": created,
                        "model": spec.model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": len(prompt_ids),
                            "completion_tokens": completion_tokens,
                            "total_tokens": len(prompt_ids) + completion_tokens,
                        },
                    }
                )
            await send(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ClientGone:
            self.metrics.cancels.labels(request.path).inc()
            return resp
        except ApiError as e:
            if not started[0]:
                raise  # nothing sent yet: a normal error response
            try:
                await send(e.body())
                await send(b"data: [DONE]\n\n")
            except ClientGone:
                self.metrics.cancels.labels(request.path).inc()
            return resp
        self.metrics.e2e.labels(request.path).observe(time.monotonic() - t0)
        return resp

    def pool_version(self) -> str:
        versions = sorted(
            {
                r.weight_version
                for r in self.pool.replicas.values()
                if r.healthy and r.state == ReplicaState.ACTIVE and r.weight_version is not None
            }
        )
        return ",".join(map(str, versions))

    def _submit_durable(self, topic: str, key: str, value: bytes) -> asyncio.Future | None:
        """Queue an event for the log; the future resolves once it is on disk (None: dropped, counted there).
        The writer thread only appends the future to a deque; after each fsync it wakes the loop once
        (`after_sync`), which resolves all of them: one wake-up per batch, not per event."""
        fut = asyncio.get_running_loop().create_future()
        return fut if self.events.submit(topic, key, value, on_durable=lambda: self._durable.append(fut)) else None

    def _wake_durable(self, loop: asyncio.AbstractEventLoop) -> None:  # the writer thread
        try:
            loop.call_soon_threadsafe(self._resolve_durable)
        except RuntimeError:  # the loop has closed (shutdown)
            pass

    def _resolve_durable(self) -> None:
        while self._durable:
            fut = self._durable.popleft()
            if not fut.done():
                fut.set_result(True)

    async def _wait_durable(self, futures: list, topic: str) -> None:
        futures = [f for f in futures if f is not None]
        if not futures:
            return
        # A spool that is failing (disk full) would make every answer wait the whole bound: do not wait.
        timeout = 0 if self.events.writer_error else self.cfg.durable_wait_s
        _, late = await asyncio.wait(futures, timeout=timeout)
        if late:
            self.metrics.answered_before_durable.labels(topic).inc(len(late))

    def _log_completion(
        self,
        tenant: Tenant,
        spec: GenerationSpec,
        cid: str,
        i: int,
        prompt_ids: list[int],
        res: engine.EngineResult,
        replica_id: str,
        timing: dict,
        source: str = "user",
    ) -> asyncio.Future | None:
        self.metrics.completions.labels(source).inc()
        arm = ""
        if self.canary is not None and source == "user":
            arm = self.canary.served(cid, replica_id, timing.get("e2e_ms") or 0.0)
        self.metrics.completion_tokens.labels(source).inc(len(res.output_ids))
        if not self.cfg.log_events:
            return None
        spans = res.weight_versions or []
        switch = next((s.get("start") for s in spans[1:]), None) if len(spans) > 1 else None
        experts = (
            res.routed_experts if res.routed_experts is not None else np.zeros((0, self.layers, self.top_k), np.uint8)
        )
        event = ev.CompletionEvent(
            completion_id=cid,
            choice_index=i,
            tenant=tenant.id,
            model_version=res.weight_version,
            prompt_ids=np.asarray(prompt_ids, np.int32),
            output_ids=np.asarray(res.output_ids, np.int32),
            logprobs=np.asarray(res.logprobs, np.float32),
            routed_experts=experts,
            sampling=spec.sampling(),
            finish_reason=finish_reason(res.finish),
            latency={**timing, "queue_ms": res.queue_ms},
            weight_versions=spans,
            switch_index=switch,
            source=source,
            replica=replica_id,
            arm=arm,
            session_id=spec.session.session_id if spec.session is not None else "",
            parent_id=spec.session.parent_id if spec.session is not None else "",
        )
        return self._submit_durable(ev.TOPIC_COMPLETIONS, cid, event.encode())

    # ------------------------------------------------------------------ feedback
    def _check_owner(self, tenant: Tenant, completion_id) -> str:
        if not isinstance(completion_id, str) or not completion_id:
            raise ApiError(
                400, "'completion_id' must be a non-empty string", param="completion_id", code="invalid_type"
            )
        owner = self.ids.owner(completion_id)
        if owner is None:
            raise ApiError(
                404, f"unknown completion id {completion_id[:80]!r}", param="completion_id", code="completion_not_found"
            )
        if owner != tenant.id:
            raise ApiError(
                403,
                "this completion was issued to another API key",
                "permission_error",
                param="completion_id",
                code="not_your_completion",
            )
        return completion_id

    async def _log_feedback(self, fb: ev.FeedbackEvent) -> None:
        if fb.session_id:  # a session's outcome: one per session; the canary votes on completions only
            # Its own memory: client-named session ids cost nothing to make up, and must not push the
            # completions' entries (one canary vote each) out of theirs.
            first = self.first_session_feedback.first(f"{fb.tenant}/{fb.session_id}", -1)
            (self.metrics.session_feedback if first else self.metrics.feedback_repeated).labels(fb.kind).inc()
        elif self.first_feedback.first(fb.completion_id, fb.choice_index):
            self.metrics.feedback.labels(fb.kind).inc()
            # The canary takes one vote per completion, whatever its n: a tenant cannot multiply its say.
            if self.canary is not None and self.first_feedback.first(fb.completion_id, -1):
                self.canary.feedback(fb.completion_id, fb.kind)
        else:  # logged all the same (the trainer's Joiner also takes only the first), counted apart
            self.metrics.feedback_repeated.labels(fb.kind).inc()
        if self.cfg.log_events:
            key = fb.session_id or fb.completion_id
            await self._wait_durable([self._submit_durable(ev.TOPIC_FEEDBACK, key, fb.encode())], ev.TOPIC_FEEDBACK)

    def _check_session(self, tenant: Tenant, session_id) -> str:
        """A session id this tenant may judge: one we derived (a signed completion id: checked like one),
        or one the client named (any 1-128 printable ASCII; events are per tenant, so it reaches only the
        tenant's own turns)."""
        if (
            not isinstance(session_id, str)
            or not session_id.isascii()
            or not session_id.isprintable()
            or not 0 < len(session_id) <= MAX_SESSION_ID
        ):
            raise ApiError(
                400,
                f"'session_id' must be 1-{MAX_SESSION_ID} printable ASCII characters",
                param="session_id",
                code="invalid_value",
            )
        if session_id.startswith("cmpl-"):
            self._check_owner(tenant, session_id)
        return session_id

    async def feedback(self, request: web.Request) -> web.Response:
        """Feedback on one completion's choice (`completion_id`), or on a whole agent session (`session_id`:
        its outcome, e.g. the edits kept or the tests passed; `kind` partial takes a `score` in [0, 1])."""
        tenant = self._tenant(request)
        body = parse_json_body(await request.read())
        allowed = {"completion_id", "session_id", "kind", "choice_index", "accepted_chars", "elapsed_ms", "score"}
        extra = sorted(set(body) - allowed)
        if extra:
            raise ApiError(
                400, f"Unrecognized request argument supplied: {extra[0]}", param=extra[0], code="unknown_parameter"
            )
        kind = body.get("kind")
        if kind not in ev.FEEDBACK_KINDS:
            raise ApiError(
                400, f"'kind' must be one of {', '.join(ev.FEEDBACK_KINDS)}", param="kind", code="invalid_value"
            )
        elapsed = body.get("elapsed_ms")
        if elapsed is not None and (
            isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed < 1e10
        ):
            raise ApiError(400, "'elapsed_ms' must be a non-negative number", param="elapsed_ms", code="invalid_value")
        if ("session_id" in body) == ("completion_id" in body):
            raise ApiError(
                400,
                "feedback names a 'completion_id' or a 'session_id' (exactly one)",
                param="completion_id",
                code="missing_required_parameter",
            )
        if "session_id" in body:
            return await self._session_feedback(tenant, body, kind, elapsed)
        if "score" in body:
            raise ApiError(
                400, "'score' goes with session feedback (use accepted_chars for a completion)", param="score"
            )
        choice = body.get("choice_index", 0)
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < self.cfg.limits.max_n:
            raise ApiError(
                400, "'choice_index' must be an integer within n", param="choice_index", code="invalid_value"
            )
        accepted = body.get("accepted_chars")
        if kind == "partial":
            if isinstance(accepted, bool) or not isinstance(accepted, int) or accepted < 0:
                raise ApiError(
                    400,
                    "partial feedback needs 'accepted_chars' (a non-negative integer)",
                    param="accepted_chars",
                    code="invalid_value",
                )
        elif accepted is not None:
            raise ApiError(400, "'accepted_chars' only goes with kind=partial", param="accepted_chars")
        cid = self._check_owner(tenant, body.get("completion_id"))
        await self._log_feedback(
            ev.FeedbackEvent(
                completion_id=cid,
                choice_index=choice,
                tenant=tenant.id,
                kind=kind,
                accepted_chars=accepted,
                elapsed_ms=elapsed,
            )
        )
        return _json({"status": "ok", "completion_id": cid})

    async def _session_feedback(self, tenant: Tenant, body: dict, kind: str, elapsed) -> web.Response:
        for name in ("choice_index", "accepted_chars"):
            if name in body:
                raise ApiError(400, f"'{name}' goes with a completion's feedback, not a session's", param=name)
        score = body.get("score")
        if kind == "partial":
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
                raise ApiError(
                    400,
                    "partial session feedback needs 'score', a number in [0, 1] (the share of "
                    "edits kept or tests passed)",
                    param="score",
                    code="invalid_value",
                )
            score = float(score)
        elif score is not None:
            raise ApiError(400, "'score' only goes with kind=partial", param="score")
        sid = self._check_session(tenant, body.get("session_id"))
        await self._log_feedback(
            ev.FeedbackEvent(
                completion_id="",
                choice_index=0,
                tenant=tenant.id,
                kind=kind,
                elapsed_ms=elapsed,
                session_id=sid,
                score=score,
            )
        )
        return _json({"status": "ok", "session_id": sid})

    async def tabby_events(self, request: web.Request) -> web.Response:
        """Tabby's /v1/events: view | select | dismiss; `?select_kind=line` makes a select partial."""
        tenant = self._tenant(request)
        body = parse_json_body(await request.read())
        etype = body.get("type")
        if etype not in ("view", "select", "dismiss"):
            raise ApiError(400, "'type' must be view, select or dismiss", param="type", code="invalid_value")
        cid = self._check_owner(tenant, body.get("completion_id"))
        choice = body.get("choice_index", 0)
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < self.cfg.limits.max_n:
            raise ApiError(400, "'choice_index' must be an integer within n", param="choice_index")
        elapsed = body.get("elapsed")
        if elapsed is not None and (isinstance(elapsed, bool) or not isinstance(elapsed, (int, float))):
            raise ApiError(400, "'elapsed' must be a number (ms)", param="elapsed")
        if etype == "view":  # shown, not yet judged: the trainer's window decides what silence means
            self.metrics.feedback.labels("view").inc()
            return _json({"status": "ok"})
        partial = request.query.get("select_kind") == "line"
        kind = "reject" if etype == "dismiss" else ("partial" if partial else "accept")
        await self._log_feedback(
            ev.FeedbackEvent(
                completion_id=cid,
                choice_index=choice,
                tenant=tenant.id,
                kind=kind,
                elapsed_ms=elapsed,
                origin="tabby:line" if partial else "tabby",
            )
        )
        return _json({"status": "ok"})

    # ------------------------------------------------------------------ misc
    async def models(self, request: web.Request) -> web.Response:
        self._tenant(request)
        return _json(
            {
                "object": "list",
                "data": [{"id": self.cfg.model_name, "object": "model", "created": 0, "owned_by": "flywheel"}],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        up = [r for r in self.pool.replicas.values() if r.healthy and r.state == ReplicaState.ACTIVE]
        events = self.events.health() if self.cfg.log_events else {"ok": True}
        ok = bool(up) and events["ok"]
        body = {
            "status": "ok" if ok else "degraded",
            "active_healthy_replicas": len(up),
            "kafka_up": self.events.stats.broker_up,
            "spool_pending_bytes": self.events.stats.pending_bytes,
            "event_log": events,
        }
        return _json(body, status=200 if ok else 503)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def admin_replicas(self, request: web.Request) -> web.Response:
        self._admin(request)
        return _json({"replicas": [r.view() for r in self.pool.replicas.values()]})

    async def admin_replica_action(self, request: web.Request) -> web.Response:
        self._admin(request)
        rid, action = request.match_info["replica"], request.match_info["action"]
        try:
            replica = self.pool.get(rid)
        except KeyError:
            raise ApiError(404, f"no replica {rid!r}", code="replica_not_found") from None
        if action not in ("drain", "activate", "borrow", "return"):
            raise ApiError(404, f"unknown action {action!r} (drain, activate, borrow, return)", code="not_found")
        raw = await request.read()
        body = parse_json_body(raw) if raw.strip() else {}
        lease = body.get("lease_s") if isinstance(body, dict) else None
        if (
            action == "drain"
            and lease is not None
            and (isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= 3600)
        ):
            raise ApiError(400, "'lease_s' must be a number of seconds in (0, 3600]", param="lease_s")
        if action in ("drain", "borrow") and replica.state == ReplicaState.ACTIVE:
            others = [r for r in self.pool.replicas.values() if r.id != rid and r.state == ReplicaState.ACTIVE]
            if not others:
                raise ApiError(409, f"refusing to {action} {rid}: it is the last active replica", code="last_active")
        if action == "drain":
            # With a lease (an agent switching weights) the drain lapses unless renewed; without (an SRE), it holds.
            replica.state, replica.borrow_pending = ReplicaState.DRAINING, False
            replica.drain_lease_until = time.monotonic() + lease if lease is not None else None
        elif action == "borrow":
            if replica.state != ReplicaState.BORROWED:
                # Users first: no new user requests from now, the in-flight ones finish, then rollouts may come.
                replica.state, replica.borrow_pending, replica.drain_lease_until = ReplicaState.DRAINING, True, None
                asyncio.create_task(self._finish_borrow(replica))
        else:  # activate / return: users come back at once; rollouts in flight are stopped for the trainer to redo
            replica.state, replica.borrow_pending, replica.drain_lease_until = ReplicaState.ACTIVE, False, None
            await self._abort_rollouts(replica)
        log.info(
            "replica %s -> %s%s (admin)",
            rid,
            replica.state.value,
            " (borrow pending)" if replica.borrow_pending else "",
        )
        return _json(replica.view())

    async def _finish_borrow(self, replica, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while replica.borrow_pending and replica.outstanding > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if replica.borrow_pending:  # not returned meanwhile
            replica.state, replica.borrow_pending = ReplicaState.BORROWED, False
            log.info("replica %s drained: borrowed for rollouts", replica.id)

    async def _abort(self, replica, rid: str) -> bool:
        """Ask a replica to stop generating `rid` (SGLang's /abort_request)."""
        try:
            async with self.session.post(
                f"{replica.url}/abort_request", json={"rid": rid}, timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                await r.read()
                return r.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.debug("could not abort %s on %s: %s", rid, replica.id, e)
            return False

    def _abort_soon(self, replica, rid: str) -> None:
        task = asyncio.ensure_future(self._abort(replica, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_rollouts(self, replica) -> None:
        for rid in list(replica.rollout_rids):
            if not await self._abort(replica, rid):
                log.warning("could not abort rollout %s on %s", rid, replica.id)

    async def admin_load(self, request: web.Request) -> web.Response:
        """User load per replica and for the fleet: what the off-peak scheduler decides on."""
        self._admin(request)
        reps = list(self.pool.replicas.values())
        active = [r for r in reps if r.state == ReplicaState.ACTIVE and r.healthy]
        in_flight = sum(r.outstanding for r in reps)
        queue = sum(r.queue_depth for r in active)
        return _json(
            {
                "replicas": [r.view() for r in reps],
                "fleet": {
                    "replicas": len(reps),
                    "active": len(active),
                    "borrowed": sum(r.state == ReplicaState.BORROWED for r in reps),
                    "borrow_pending": sum(r.borrow_pending for r in reps),
                    "in_flight": in_flight,
                    "queue_depth": queue,
                    "request_rate": round(sum(r.rate for r in reps), 3),
                    "load_per_active": round((in_flight + queue) / max(1, len(active)), 3),
                },
            }
        )

    async def admin_rollouts(self, request: web.Request) -> web.Response:
        """Trainer-side generation: n samples of one prompt, with token ids, behaviour logprobs, routed
        experts and version, on replicas lent to rollouts. Logged as source=rollout, never as user traffic."""
        self._admin(request)
        body = parse_json_body(await request.read())
        where = body.pop("replicas", "any")
        if where not in ("any", "borrowed"):
            raise ApiError(400, "'replicas' must be 'any' or 'borrowed'", param="replicas")
        spec = parse_completion(
            {"model": "rollout", **{k: v for k, v in body.items() if k != "model"}}, self.cfg.limits
        )
        if spec.stream:
            raise ApiError(400, "rollouts do not stream", param="stream")
        prompt_ids = await self._prompt_ids(spec)
        sampling = self._sampling(spec)
        rid = f"rollout-{time.time_ns():x}"
        bodies = [engine.payload(prompt_ids, sampling, 0, False, f"{rid}-{i}") for i in range(spec.n)]
        results = await asyncio.gather(
            *(self._run_choice(b, False, rollout=True, borrowed_only=where == "borrowed") for b in bodies)
        )
        trainer = Tenant(id="trainer", name="trainer")
        choices = []
        for i, (res, replica_id, timing) in enumerate(results):
            self._log_completion(trainer, spec, rid, i, prompt_ids, res, replica_id, timing, source="rollout")
            experts = (
                res.routed_experts
                if res.routed_experts is not None
                else np.zeros((0, self.layers, self.top_k), np.uint8)
            )
            choices.append(
                {
                    "index": i,
                    "text": res.text,
                    "output_ids": res.output_ids,
                    "logprobs": res.logprobs,
                    "routed_experts": base64.b64encode(experts.tobytes()).decode(),
                    "routed_experts_shape": list(experts.shape),
                    "weight_version": res.weight_version,
                    "finish_reason": "abort"
                    if (res.finish or {}).get("type") == "abort"
                    else finish_reason(res.finish),
                    "replica": replica_id,
                }
            )
        return _json({"id": rid, "prompt_ids": prompt_ids, "choices": choices})

    async def admin_canary(self, request: web.Request) -> web.Response:
        self._admin(request)
        return _json({"canary": None if self.canary is None else self.canary.view()})

    async def admin_canary_start(self, request: web.Request) -> web.Response:
        """Start a trial: {"version", "replicas": [ids], "share"}: that share of users goes to those replicas."""
        self._admin(request)
        body = parse_json_body(await request.read())
        reps = body.get("replicas")
        if not isinstance(reps, list) or not reps or not all(isinstance(r, str) for r in reps):
            raise ApiError(400, "'replicas' must be a non-empty list of replica ids", param="replicas")
        unknown = [r for r in reps if r not in self.pool.replicas]
        if unknown:
            raise ApiError(400, f"unknown replicas {unknown}", param="replicas")
        if len(reps) >= len(self.pool.replicas):
            raise ApiError(400, "a canary must leave at least one stable replica", param="replicas")
        share = body.get("share")
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share < 1:
            raise ApiError(400, "'share' must be a number between 0 and 1", param="share")
        version = ev.parse_version(body.get("version"))
        if version is None:
            raise ApiError(400, "'version' must be the canary's weight version (an integer)", param="version")
        self.canary = CanarySplit(version=version, replicas=frozenset(reps), share=float(share))
        log.info("canary trial of v%s on %s for %.0f%% of users", version, ",".join(reps), 100 * share)
        return _json({"canary": self.canary.view()})

    async def admin_canary_end(self, request: web.Request) -> web.Response:
        self._admin(request)
        ended, self.canary = self.canary, None
        return _json({"canary": None if ended is None else ended.view()})

    async def admin_weights(self, request: web.Request) -> web.Response:
        self._admin(request)
        return _json(
            {
                "replicas": {r.id: r.weight_version for r in self.pool.replicas.values()},
                "tool_calls": self.metrics.tools.view(),
            }
        )


def _trimmed_stop(res: engine.EngineResult) -> str:
    """The closing tag of a call when SGLang stopped on it (and trimmed it from the text)."""
    return tf.CALL_CLOSE if (res.finish or {}).get("matched") == tf.CALL_CLOSE else ""


def _fingerprint(version: int | None) -> str | None:
    return None if version is None else f"flywheel-v{version}"


def _json(body, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, headers=headers, content_type="application/json")


def _error_response(e: ApiError) -> web.Response:
    return _json(e.body(), status=e.status)


def run(cfg: GatewayConfig) -> None:
    """Serve until interrupted (SIGINT/SIGTERM shut down cleanly: the event log is flushed to its spool)."""
    import uvloop

    uvloop.install()  # measured: a faster loop for the HTTP hop (benchmarks.gateway)
    gw = Gateway(cfg)
    web.run_app(gw.app, host=cfg.host, port=cfg.port, access_log=None, print=lambda *a: log.info(*a))
