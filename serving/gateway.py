"""The Flywheel gateway: an OpenAI-compatible API in front of SGLang replicas (aiohttp).

    client --HTTP--> auth -> validate -> tokenize -> pick replica (serving.routing) -> /generate
                                                   <- tokens, logprobs, routed experts, weight version
           <-- OpenAI response (+ completion id, model version) --'  '--> completion event -> event log

Feedback (`/v1/feedback`, Tabby's `/v1/events`) becomes feedback events keyed by the same completion id.
Events go through serving.event_log.pipeline: the request path never waits on Kafka.

This module wires the parts: the shared state (keys, ids, sessions, the replica pool, the dispatcher, the
event sink, metrics), the root app (errors, /health, /metrics) and the sub-apps of serving.api.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from admin_api import routes as admin_routes
from contracts import replica_keys
from serving.api.admin import AdminApi
from serving.api.completions import CompletionsApi
from serving.api.feedback import FeedbackApi
from serving.api.messages import MessagesApi, anthropic_errors
from serving.api.respond import error_response, json_response
from serving.api.responses import ResponsesApi
from serving.api.tenants import TenantsApi
from serving.api.turn import TurnParts
from serving.auth import CompletionIds, KeyStore, load_or_create_secret, tenant_middleware
from serving.config import GatewayConfig
from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.sink import EventSink
from serving.metrics import GatewayMetrics
from serving.protocol.prompts import Prompter
from serving.protocol.schema import ApiError
from serving.response_store import ResponseStore
from serving.routing.dispatcher import DispatchConfig, Dispatcher
from serving.routing.pool import ReplicaPool
from serving.routing.replica import ReplicaState
from serving.signals.first_feedback import FirstFeedback
from serving.signals.implicit import ImplicitSignals
from serving.signals.served_index import ServedIndex
from serving.signals.session_ids import SessionIds
from serving.signals.sessions import Sessions
from serving.tenants.cache_scope import CacheScopes
from serving.tenants.limits import TenantLimits
from serving.tenants.policy import TenantPolicies

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, cfg: GatewayConfig):
        if not cfg.replicas:
            raise ValueError("the gateway needs at least one replica URL")
        if cfg.model_dir is None:
            raise ValueError("the gateway needs the model dir (for its tokenizer and config)")
        self.cfg = cfg
        self.prompter = Prompter(Path(cfg.model_dir), cfg.limits)
        self.keys = KeyStore.load(cfg.keys_file, cfg.api_keys)
        state = Path(cfg.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.ids = CompletionIds(load_or_create_secret(state / "id_secret"))
        self.first_feedback = FirstFeedback()
        self.first_session_feedback = FirstFeedback(capacity=200_000)
        self.sessions = Sessions()
        self.responses = ResponseStore(state / "responses.sqlite", cfg.response_retention_days)
        self.pool = ReplicaPool(cfg.replicas, cfg.pool, cfg.routing)
        self.events = EventLog(
            EventLogConfig(
                spool_dir=state / "spool",
                bootstrap=cfg.kafka_bootstrap,
                max_spool_bytes=cfg.max_spool_bytes,
                scrub=cfg.scrub_secrets,
                sync_window_s=cfg.spool_sync_window_s,
            )
        )
        self.metrics = GatewayMetrics(self)
        self.sink = EventSink(self.events, self.metrics.answered_before_durable, cfg.log_events, cfg.durable_wait_s)
        self.dispatcher = Dispatcher(
            self.pool,
            self.sink,
            self.metrics,
            DispatchConfig(cfg.max_attempts, cfg.request_timeout_s, self.prompter.layers, self.prompter.top_k),
        )
        self.dispatcher.train_policy = lambda tenant: self.keys.policy(tenant.name).train
        self.dispatcher.cache_scopes = CacheScopes(self.ids.secret if cfg.routing.isolate_tenants else None)
        self.served = ServedIndex()
        self.dispatcher.on_served = lambda tenant, spec, cid, i, text: self.served.record(
            tenant.id, spec.prompt, spec.suffix, text, cid, i
        )
        self.policies = TenantPolicies(
            self.keys, self.responses, self.events, self.sink, cfg.log_events, cfg.durable_wait_s
        )
        self.implicit = ImplicitSignals(cfg.abandon_after_s)
        self.session_ids = SessionIds(self.ids.secret, cfg.scrub_secrets and cfg.log_events, self.metrics.registry)
        self.feedback = FeedbackApi(
            cfg.limits.max_n,
            ids=self.ids,
            sessions=self.sessions,
            session_ids=self.session_ids,
            served=self.served,
            dispatcher=self.dispatcher,
            sink=self.sink,
            metrics=self.metrics,
            first_feedback=self.first_feedback,
            first_session_feedback=self.first_session_feedback,
        )
        # What a turn uses, whichever API runs it (chat, Responses, Messages): serving.api.turn
        self.turns = TurnParts(
            cfg.limits,
            cfg.model_name,
            self.prompter,
            self.ids,
            self.dispatcher,
            self.sink,
            self.metrics,
            self.sessions,
            self.session_ids,
            self.implicit,
            self.feedback.signal,
        )
        self.tenant_limits = TenantLimits(cfg.tenant_limits, self.keys, self.metrics.registry)
        self._sweeper: asyncio.Task | None = None
        self.session: aiohttp.ClientSession | None = None
        self.app = self._build_app()

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.limits.max_body_bytes, middlewares=[self._errors])
        app.add_routes([web.get("/health", self.health), web.get("/metrics", self.prometheus)])
        limited = [tenant_middleware(self.keys), self.tenant_limits.middleware]  # the tenant known, then its limits
        v1 = web.Application(middlewares=[anthropic_errors, *limited])
        apis = (
            CompletionsApi(self.turns),
            self.feedback,
            ResponsesApi(self.turns, self.responses),
            MessagesApi(self.turns),
        )
        v1.add_routes([route for api in apis for route in api.routes()])
        app.add_subapp("/v1", v1)
        tenants = TenantsApi(self.keys, self.policies, self.tenant_limits, self.cfg.keys_file)
        admin = AdminApi(
            self.cfg.admin_token,
            self.pool,
            self.dispatcher,
            self.prompter,
            self.cfg.limits,
            self.metrics.monitors,
            tenants,
        )
        app.add_subapp(admin_routes.PREFIX, admin.app())
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        # Used for the replicas only: it carries their inference key (never the admin key: contracts.replica_keys)
        headers = replica_keys.inference_headers()
        self.session = self.dispatcher.session = aiohttp.ClientSession(connector=connector, headers=headers)
        self.sink.start()
        await self.policies.start()
        await self.pool.start(self.session)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_sessions())

    async def _sweep_sessions(self) -> None:
        """Agent sessions left waiting for tool results too long: abandoned (serving.signals.implicit)."""
        while True:
            await asyncio.sleep(min(10.0, self.cfg.abandon_after_s / 4))
            for key, signal in self.implicit.sweep_keyed():
                self.feedback.signal(key[0], signal)

    async def _cleanup(self, app) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.policies.stop()
        self.responses.close()
        await self.pool.stop()
        if self.session:
            await self.session.close()
        await self.sink.close(10.0)

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            resp = await handler(request)
        except ApiError as e:
            resp = error_response(e)
        except web.HTTPException as e:  # aiohttp's own: 404 no route, 405 method, 413 body too large
            if e.status < 400:
                raise
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
            resp = error_response(ApiError(e.status, e.reason or "error", kind, code=code))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            resp = error_response(ApiError(500, "internal error", "server_error", code="internal_error"))
        self.metrics.requests.labels(route, str(resp.status)).inc()
        return resp

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
        return json_response(body, status=200 if ok else 503)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def run(cfg: GatewayConfig) -> None:
    """Serve until interrupted (SIGINT/SIGTERM shut down cleanly: the event log is flushed to its spool)."""
    import uvloop

    uvloop.install()  # measured: a faster loop for the HTTP hop (benchmarks.gateway)
    gw = Gateway(cfg)
    web.run_app(gw.app, host=cfg.host, port=cfg.port, access_log=None, print=lambda *a: log.info(*a))
