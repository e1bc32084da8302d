"""`flywheel status` (flywheel.status.gather, .panels, .screen) against real HTTP servers on loopback (the fake
fleet: tests/status_fleet.py): a gateway's admin API (the real admin-token middleware, replica and canary views from
serving's own classes) and its /metrics (a prometheus_client registry with the gateway's series), the trainer's real
metrics registry, the real weight store app over a store directory, and a Prometheus HTTP API answering recorded
shapes. Then the same against a closed port, a wrong token, a hung server and pages that are not what they should
be: each part says why in one line, the others still show, and nothing raises."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from contextlib import redirect_stdout

import pytest
from aiohttp import web
from rich.console import Console

from flywheel.status.gather import StatusConfig, failed, fold_activations, gather
from flywheel.status.screen import render, run
from flywheel.status.sources import quantile
from tests.status_fleet import (
    STORE_TOKEN,
    TOKEN,
    closed_url,
    gateway_app,
    prometheus_app,
    served,
    store_app,
    trainer_app,
)

pytestmark = pytest.mark.timeout(120)


def screen(data: dict) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(data))
    return console.export_text()


# ----------------------------------------------------------------------------- tests


def test_quantile_interpolates_like_prometheus():
    # 99 observations in (0.01, 0.025], one in (2.5, 5]: the 99th is at the top of the first bucket
    assert quantile(0.99, {0.01: 0, 0.025: 99, 5.0: 100, float("inf"): 100}) == pytest.approx(0.025)
    assert quantile(0.5, {0.1: 0, 0.2: 10, float("inf"): 10}) == pytest.approx(0.15)
    assert quantile(0.99, {1.0: 0, float("inf"): 5}) == 1.0  # in the +Inf bucket: the highest finite bound
    assert quantile(0.99, {1.0: 0, float("inf"): 0}) is None and quantile(0.99, {}) is None


def test_fold_activations():
    folded = fold_activations(
        [
            {"seq": 3, "type": "promote", "version": 6},
            {"seq": 1, "type": "canary", "version": 6},
            {"seq": 4, "type": "canary", "version": 7},
            {"seq": 5, "type": "rollback", "version": 7, "stable": 6},
            {"seq": 6, "type": "pin", "version": 6},
            {"seq": 7, "type": "unpin"},
            {"seq": 8, "type": "pin", "version": 5},
            {"seq": 9, "type": "garbage"},
        ]
    )
    assert folded == {"canary": {6: "promoted", 7: "rolled back"}, "stable": 6, "pinned": 5}


def test_a_whole_fleet_without_prometheus(tmp_path):
    now = time.time()
    with (
        served(gateway_app()) as gw,
        served(trainer_app(last_publish=now - 40, interval=75)) as tr,
        served(store_app(tmp_path)) as st,
    ):
        cfg = StatusConfig(gateway=gw, admin_token=TOKEN, trainer=tr, store_url=st, sample_s=0.5, timeout_s=5)
        cfg.store_token = STORE_TOKEN
        data = gather(cfg)
    assert failed(data) == []
    assert data["kafka"]["not_given"] and data["alerts"]["error"].startswith("no Prometheus given")

    reps = {r["id"]: r for r in data["replicas"]["replicas"]}
    assert reps["r0"]["weight_version"] == 6 and reps["r2"]["state"] == "borrowed" and not reps["r2"]["healthy"]
    g = data["gateway"]
    assert g["rate"]["source"].startswith("two scrapes") and 5 < g["rate"]["requests_per_s"] <= 20  # 10 per ≥0.5 s
    assert g["rate"]["errors_per_s"] == 0
    assert g["p99"]["seconds"] == pytest.approx(0.025) and "since the gateway started" in g["p99"]["source"]
    assert g["kafka_up"] == 1 and g["spool_pending_bytes"] == 3 * 1024 * 1024
    assert data["trainer"]["step"] == 412 and data["trainer"]["published_version"] == 7
    assert data["trainer"]["next_publish_ts"] == pytest.approx(now + 35, abs=1)

    vs = data["versions"]
    assert vs["stable"] == 6 and vs["newest"] == 7 and vs["pinned"] is None
    rows = {r["version"]: r for r in vs["versions"]}
    assert rows[5]["canary"] == "rolled back" and rows[6]["canary"] == "promoted" and rows[7]["canary"] == "in trial"
    assert rows[6]["acceptance"] == pytest.approx(20 / 30) and rows[6]["acceptance_source"] == "gateway"
    assert rows[7]["acceptance"] == pytest.approx(9 / 12) and rows[7]["replicas"] == ["r1"]
    assert rows[5]["acceptance"] == 0.5 and rows[5]["acceptance_source"] == "trainer"
    assert rows[6]["reward_mean"] == pytest.approx(0.61) and rows[6]["p99_s"] == pytest.approx(0.01 + 0.015 * 0.99)

    text = screen(data)
    for expected in (
        "Replicas (routing: cache_aware)",
        "borrowed",
        "[/x] timeout",  # shown as it is, not read as rich markup
        "canary v7",
        "two scrapes",
        "p99 25 ms (histogram since the gateway started)",
        "spool 3.0 MiB pending",
        "step 412",
        "Canary trial of v7 on r1 for 25% of users",
        "rolled back",
        "66.7%",
        "no Prometheus given",
        "no Kafka bootstrap given",
    ):
        assert expected in text, f"{expected!r} not on the screen:\n{text}"
    assert re.search(r"last publish 4\d s ago,  next in 3\d s", text), text
    assert "Traceback" not in text


def test_prometheus_gives_rate_p99_and_alerts(tmp_path):
    with served(gateway_app()) as gw, served(prometheus_app()) as prom:
        data = gather(StatusConfig(gateway=gw, admin_token=TOKEN, prometheus=prom, timeout_s=5))
    g = data["gateway"]
    assert g["rate"] == {"requests_per_s": 12.5, "errors_per_s": 0.5, "source": "Prometheus, rate over 1m"}
    assert g["p99"] == {"seconds": 0.85, "source": "Prometheus, over 5m"}
    assert [a["name"] for a in data["alerts"]["firing"]] == ["FlywheelReplicaDown"] and data["alerts"]["pending"] == 1
    text = screen(data)
    assert "requests 12.50/s (Prometheus, rate over 1m)" in text and "p99 850 ms" in text and "5xx 4.0%" in text
    assert "Alerts firing (1)" in text and "FlywheelReplicaDown" in text and "replica r2 fails" in text
    assert re.search(r"FlywheelReplicaDown +page +5 min +replica r2 fails", text), text

    with served(gateway_app()) as gw, served(prometheus_app(firing=False)) as prom:
        data = gather(StatusConfig(gateway=gw, admin_token=TOKEN, prometheus=prom, timeout_s=5))
    assert data["alerts"]["firing"] == [] and "none firing" in screen(data)


def test_prometheus_down_falls_back_to_scrapes():
    with served(gateway_app()) as gw:
        data = gather(StatusConfig(gateway=gw, admin_token=TOKEN, prometheus=closed_url(), sample_s=0.2))
    assert data["gateway"]["rate"]["source"].startswith("two scrapes")
    assert "connection refused" in data["gateway"]["prometheus_error"]
    assert "connection refused" in data["alerts"]["error"] and failed(data) == ["alerts"]


def test_every_source_unreachable_is_one_line_each():
    port = closed_url()
    cfg = StatusConfig(
        gateway=port, admin_token=TOKEN, kafka=port.removeprefix("http://"), trainer=port, store_url=port,
        prometheus=port, timeout_s=1, sample_s=0,
    )  # fmt: skip
    t0 = time.monotonic()
    data = gather(cfg)
    assert time.monotonic() - t0 < 15
    assert failed(data) == ["replicas", "canary", "gateway", "kafka", "trainer", "versions", "alerts"]
    for part in ("replicas", "canary", "gateway", "trainer", "versions", "alerts"):
        assert "connection refused" in data[part]["error"], data[part]
        assert "\n" not in data[part]["error"]
    assert "cannot reach Kafka" in data["kafka"]["error"]
    text = screen(data)
    assert "Traceback" not in text and text.count("✗") == 7


def test_wrong_admin_token_and_no_token():
    with served(gateway_app(token="the-real-one")) as gw:
        data = gather(StatusConfig(gateway=gw, admin_token="wrong", sample_s=0))
        assert "HTTP 401" in data["replicas"]["error"] and "FLYWHEEL_ADMIN_TOKEN" in data["replicas"]["error"]
        assert "admin endpoints need the admin token" in data["replicas"]["error"]
        assert "requests_per_s" in data["gateway"]["rate"]  # /metrics needs no token: that part still shows
        data = gather(StatusConfig(gateway=gw, sample_s=0))
        assert "no admin token" in data["replicas"]["error"] and failed(data) == ["replicas", "canary"]


def test_garbage_and_wrong_services(tmp_path):
    async def hung(request):
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def not_a_trainer(request):
        return web.Response(text="process_cpu_seconds_total 1.5\n")

    async def not_a_store(request):
        return web.Response(text="<html>a proxy login page</html>", content_type="text/html")

    other = web.Application()
    other.add_routes([web.get("/metrics", not_a_trainer), web.get("/versions", not_a_store)])
    slow = web.Application()
    slow.add_routes([web.get("/{tail:.*}", hung)])
    garbage = "flywheel_gateway_requests_total{route= this is {{{ not metrics\n\x00\x01"
    with served(gateway_app(metrics_text=garbage)) as gw, served(other) as oth, served(slow) as sl:
        data = gather(StatusConfig(gateway=gw, admin_token=TOKEN, trainer=oth, store_url=oth, sample_s=0))
        assert "not a Prometheus metrics page" in data["gateway"]["error"]
        assert "is this the trainer?" in data["trainer"]["error"]
        assert "not JSON" in data["versions"]["error"]
        assert data["replicas"]["replicas"]  # the admin API of the same gateway is fine
        data = gather(StatusConfig(trainer=sl, store_url=sl, timeout_s=0.5))
        assert "no answer within 0.5 s" in data["trainer"]["error"] and "no answer" in data["versions"]["error"]
    assert "Traceback" not in screen(data)


def test_render_never_raises_on_odd_shapes():
    data = {
        "at": time.time(),
        "replicas": {"replicas": [{"id": "r0", "drain_lease_s": "soon"}]},  # a type it does not expect
        "canary": {"trial": None},
        "gateway": {"rate": None, "p99": None},
        "kafka": {"error": "cannot reach Kafka at x:1: KafkaTimeoutError"},
        "trainer": "not a dict",
        "versions": {"error": "no weight store given (--store-url or FLYWHEEL_STORE_URL)", "not_given": True},
    }
    text = screen(data)
    assert "replicas: cannot draw it" in text and "trainer: nothing gathered" in text
    assert "alerts: nothing gathered" in text and "cannot reach Kafka" in text and "Traceback" not in text


def test_cli_json_is_valid_json_and_exit_codes(tmp_path, monkeypatch):
    from flywheel.cli import main

    for name in ("FLYWHEEL_KAFKA_BOOTSTRAP", "FLYWHEEL_TRAINER_METRICS_URL", "FLYWHEEL_PROMETHEUS_URL"):
        monkeypatch.delenv(name, raising=False)
    with served(gateway_app()) as gw, served(store_app(tmp_path)) as st:
        monkeypatch.setenv("FLYWHEEL_GATEWAY_URL", closed_url())  # the flag wins over it
        monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", TOKEN)
        monkeypatch.setenv("FLYWHEEL_STORE_URL", st)
        monkeypatch.setenv("FLYWHEEL_STORE_TOKEN", STORE_TOKEN)
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["status", "--json", "--gateway", gw, "--sample-s", "0"])
        data = json.loads(out.getvalue())
        assert rc == 0, data
        assert set(data) >= {"at", "replicas", "gateway", "kafka", "trainer", "versions", "alerts", "canary"}
        assert data["trainer"]["not_given"] and data["versions"]["versions"][-1]["version"] == 7

        monkeypatch.setenv("FLYWHEEL_STORE_URL", closed_url())
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["status", "--json", "--gateway", gw, "--sample-s", "0", "--timeout-s", "1"])
        assert rc == 1 and "connection refused" in json.loads(out.getvalue())["versions"]["error"]

    with pytest.raises(SystemExit):  # the admin token is never a flag
        main(["status", "--admin-token", "x"])
    monkeypatch.delenv("FLYWHEEL_GATEWAY_URL")
    monkeypatch.delenv("FLYWHEEL_STORE_URL")
    monkeypatch.delenv("FLYWHEEL_ADMIN_TOKEN")
    out = io.StringIO()
    with redirect_stdout(out):
        assert run(StatusConfig(), as_json=True) == 1  # nothing given at all: nothing to say it is fine
    assert json.loads(out.getvalue())["gateway"]["not_given"]
