"""A fake fleet for `flywheel status` tests (tests/unit/flywheel/status/test_status.py) on loopback HTTP: a
gateway's admin API
(the real admin-token middleware, replica and canary views from serving's own classes) and its /metrics (a
prometheus_client registry with the gateway's series), the trainer's real metrics registry, the real weight store
app over a store directory, and a Prometheus HTTP API answering recorded shapes; each served in a thread of its
own, and a port where nothing listens.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from admin_api import routes
from infra.procs import free_port

TOKEN = "admin-secret"
STORE_TOKEN = "status-fleet-read-token"


@contextmanager
def served(app: web.Application):
    """The app on a free loopback port, in a thread and loop of its own (gather() is blocking code)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, port = web.AppRunner(app, shutdown_timeout=0.5), free_port()

    async def start():
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def gateway_app(token: str = TOKEN, per_scrape: int = 10, metrics_text: str | None = None) -> web.Application:
    """The gateway's /metrics and /admin, in the shapes its own classes give."""
    from serving.api.respond import error_response
    from serving.auth import admin_middleware
    from serving.canary_split import CanarySplit
    from serving.metrics import LATENCY_BUCKETS
    from serving.protocol.schema import ApiError
    from serving.routing.replica import ReplicaHandle, ReplicaState
    from serving.version_stats import VersionStats

    reps = [
        ReplicaHandle(id="r0", url="http://127.0.0.1:1", healthy=True, weight_version=6, outstanding=3, served=120),
        ReplicaHandle(id="r1", url="http://127.0.0.1:2", healthy=True, weight_version=7, outstanding=1, served=40),
        ReplicaHandle(
            id="r2", url="http://127.0.0.1:3", state=ReplicaState.BORROWED, healthy=False, last_error="[/x] timeout"
        ),
    ]
    trial = CanarySplit(version=7, replicas=frozenset({"r1"}), share=0.25)
    trial.stats["canary"].requests, trial.stats["canary"].accepts, trial.stats["canary"].rejects = 40, 9, 3
    trial.stats["stable"].requests, trial.stats["stable"].accepts, trial.stats["stable"].rejects = 120, 20, 10

    r = CollectorRegistry()
    requests = Counter("flywheel_gateway_requests", "", ["route", "status"], registry=r)
    e2e = Histogram("flywheel_gateway_e2e_latency_seconds", "", ["route"], buckets=LATENCY_BUCKETS, registry=r)
    Gauge("flywheel_kafka_up", "", registry=r).set(1)
    Gauge("flywheel_event_spool_pending_bytes", "", registry=r).set(3 * 1024 * 1024)
    Gauge("flywheel_event_spool_alarm", "", registry=r).set(0)
    Gauge("flywheel_replica_healthy", "", ["replica"], registry=r).labels("r0").set(1)
    versions = VersionStats(r, LATENCY_BUCKETS)
    for _ in range(99):
        e2e.labels("/v1/completions").observe(0.02)
    e2e.labels("/v1/completions").observe(3.0)
    for i in range(30):
        versions.served(f"c6-{i}", 0, 6, 0.02)
        versions.judged(f"c6-{i}", "accept" if i < 20 else "reject")
    for i in range(12):
        versions.served(f"c7-{i}", 0, 7, 0.02)
        versions.judged(f"c7-{i}", "accept" if i < 9 else "reject")

    async def metrics(request):
        if metrics_text is not None:
            return web.Response(text=metrics_text)
        requests.labels("/v1/completions", "200").inc(per_scrape)  # traffic between two scrapes
        requests.labels("/metrics", "200").inc(1000)  # scrapes are not user traffic
        return web.Response(body=generate_latest(r), content_type="text/plain")

    async def replicas(request):
        return web.json_response({"replicas": [x.view() for x in reps], "routing": {"policy": "cache_aware"}})

    async def canary(request):
        return web.json_response({"canary": trial.view()})

    @web.middleware
    async def errors(request, handler):  # the gateway's own: an ApiError becomes its OpenAI-shaped answer
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)

    admin = web.Application(middlewares=[admin_middleware(token)])
    admin.add_routes([web.get(routes.LIST_REPLICAS.local, replicas), web.get(routes.GET_CANARY.local, canary)])
    app = web.Application(middlewares=[errors])
    app.add_routes([web.get("/metrics", metrics)])
    app.add_subapp(routes.PREFIX, admin)
    return app


def trainer_app(last_publish: float | None = None, interval: float | None = None) -> web.Application:
    from online_rl.data.join import JoinStats
    from online_rl.trainer.metrics import TrainerMetrics

    m = TrainerMetrics(lambda: JoinStats())
    m.step.set(412)
    m.version.set(7)
    m.kl.set(0.0123)
    m.reward.labels("6").set(0.61)
    m.acceptance.labels("5").set(0.5)  # a version the gateway no longer counts
    if last_publish is not None:
        Gauge("flywheel_trainer_last_publish_timestamp_seconds", "", registry=m.registry).set(last_publish)
        Gauge("flywheel_trainer_publish_interval_seconds", "", registry=m.registry).set(interval)

    async def metrics(request):
        return web.Response(body=generate_latest(m.registry), content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    return app


def store_app(tmp_path) -> web.Application:
    """The real store's HTTP face over versions 4..7; v6 promoted after a trial, v7 in trial now."""
    from weight_sync.store.server import Store

    store = Store(tmp_path / "store")
    for v in (4, 5, 6, 7):
        (store.root / "versions" / str(v)).mkdir(parents=True)
    for seq, rec in enumerate(
        [
            {"type": "canary", "version": 5, "stable": 4, "replicas": ["r1"]},
            {"type": "rollback", "version": 5, "stable": 4},
            {"type": "canary", "version": 6, "stable": 4, "replicas": ["r1"]},
            {"type": "promote", "version": 6},
            {"type": "canary", "version": 7, "stable": 6, "replicas": ["r1"]},
        ],
        start=1,
    ):
        store.record_activation({"schema": "flywheel.control/1", "seq": seq, "ts": time.time(), "reason": "t", **rec})
    return store.app(token=STORE_TOKEN)


def prometheus_app(firing: bool = True) -> web.Application:
    """Prometheus's HTTP API (/api/v1/query, /api/v1/alerts) in its documented response shapes."""

    async def query(request):
        q = request.query["query"]
        value = "0.85" if "histogram_quantile" in q else ("0.5" if 'status=~"5.."' in q else "12.5")
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, value]}]}}
        )

    async def alerts(request):
        rows = [
            {
                "labels": {"alertname": "FlywheelReplicaDown", "severity": "page", "replica": "r2"},
                "annotations": {"summary": "replica r2 fails its health checks"},
                "state": "firing" if firing else "pending",
                "activeAt": time.strftime("%Y-%m-%dT%H:%M:%S.123456789Z", time.gmtime(time.time() - 300)),
                "value": "0e+00",
            },
            {"labels": {"alertname": "FlywheelSpoolGrowing"}, "annotations": {}, "state": "pending"},
        ]
        return web.json_response({"status": "success", "data": {"alerts": rows}})

    app = web.Application()
    app.add_routes([web.get("/api/v1/query", query), web.get("/api/v1/alerts", alerts)])
    return app
