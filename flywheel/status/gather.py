"""`flywheel status`, the gathering half: one dict of everything an SRE looks at first, read from the running
fleet (the rendering and the command are flywheel.status.screen).

    replicas   the gateway's GET /admin/replicas (admin token): state, health, version, load of each
    canary     the gateway's GET /admin/canary: the trial in progress and what each arm saw
    gateway    the gateway's /metrics: request rate and p99 (from Prometheus when one is given, else from
               two scrapes `sample_s` apart and the latency histogram since the gateway started), 5xx
               share, Kafka up, spool depth, completions and feedback by weight version
    kafka      consumer lag of the trainer's group and of every agent's (committed offset to log end)
    trainer    the trainer's /metrics: step, published version, KL, last and next publish
    versions   the weight store's GET /versions: the newest versions with their canary outcome, pin and
               stable marks, served replicas and acceptance (gateway counters, else the trainer's gauge)
    alerts     Prometheus's GET /api/v1/alerts: those firing

gather() never raises: each part is its data or {"error": "<one line>"} ("not_given": true when nothing
said where to find it), so a dead broker or a wrong token costs its own part and nothing else.
"""

from __future__ import annotations

import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from admin_api import routes
from flywheel.status.sources import Unexpected, admin_get, get_json, one, quantile, scrape, total, user_route
from infra.config import option

PARTS = ("replicas", "canary", "gateway", "kafka", "trainer", "versions", "alerts")


@dataclass
class StatusConfig:
    gateway: str | None = option(None, env="FLYWHEEL_GATEWAY_URL", help="the gateway's base URL")
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the gateway's admin token (environment only)"
    )
    kafka: str | None = option(None, env="FLYWHEEL_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers (host:port,...)")
    trainer: str | None = option(
        None, env="FLYWHEEL_TRAINER_METRICS_URL", help="the trainer's metrics URL (base or .../metrics)"
    )
    store_url: str | None = option(None, env="FLYWHEEL_STORE_URL", help="the weight store's base URL")
    store_token: str | None = option(
        None, env="FLYWHEEL_STORE_TOKEN", cli=False, help="the fleet read credential the store wants (environment only)"
    )
    prometheus: str | None = option(
        None, env="FLYWHEEL_PROMETHEUS_URL", help="a Prometheus server: alerts, and rate and p99 by PromQL"
    )
    trainer_group: str = option("flywheel-trainer", help="the trainer's Kafka consumer group")
    agent_group_prefix: str = option("flywheel-agent-", help="prefix of the weight agents' consumer groups")
    timeout_s: float = option(3.0, help="seconds each source has to answer")
    sample_s: float = option(1.0, help="seconds between the two /metrics scrapes the request rate is taken from")
    versions: int = option(8, help="how many of the newest versions to show")

    def __post_init__(self):
        if not self.timeout_s > 0 or not self.sample_s >= 0 or self.versions < 1:
            raise ValueError("--timeout-s must be positive, --sample-s not negative, --versions at least 1")


# ----------------------------------------------------------------------------- the parts


def _part(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # one part's failure is one line in its place, never a traceback
        return {"error": " ".join(str(e).split())[:300] or type(e).__name__}


def _not_given(what: str, flag: str, env: str) -> dict:
    return {"error": f"no {what} given ({flag} or {env})", "not_given": True}


def _given(source: str | None) -> str:
    assert source, "gather() asks a part only of a source that was given"
    return source


def gather_replicas(cfg: StatusConfig) -> dict:
    if not cfg.admin_token:
        return {"error": "no admin token: set FLYWHEEL_ADMIN_TOKEN (it never goes on a command line)"}
    path = routes.LIST_REPLICAS.path
    data = admin_get(_given(cfg.gateway), cfg.admin_token, path, cfg.timeout_s)
    reps = data.get("replicas")
    if not isinstance(reps, list) or not all(isinstance(r, dict) and "id" in r for r in reps):
        raise Unexpected(f"the gateway admin API at {cfg.gateway}: {path} has no list of replicas")
    return {"replicas": reps, "routing": (data.get("routing") or {}).get("policy")}


def gather_canary(cfg: StatusConfig) -> dict:
    if not cfg.admin_token:
        return {"error": "no admin token: set FLYWHEEL_ADMIN_TOKEN (it never goes on a command line)"}
    path = routes.GET_CANARY.path
    data = admin_get(_given(cfg.gateway), cfg.admin_token, path, cfg.timeout_s)
    if "canary" not in data or not isinstance(data["canary"], (dict, type(None))):
        raise Unexpected(f"the gateway admin API at {cfg.gateway}: {path} has no 'canary' field")
    return {"trial": data["canary"]}


def _per_version(m: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for labels, v in m.get("flywheel_gateway_version_completions_total", []):
        out.setdefault(labels.get("version", "unknown"), {})["completions"] = int(v)
    for labels, v in m.get("flywheel_gateway_version_feedback_total", []):
        row = out.setdefault(labels.get("version", "unknown"), {})
        row[labels.get("kind", "other")] = row.get(labels.get("kind", "other"), 0) + int(v)
    buckets: dict[str, dict[float, float]] = {}
    for labels, v in m.get("flywheel_gateway_version_latency_seconds_bucket", []):
        b = buckets.setdefault(labels.get("version", "unknown"), {})
        le = float(labels.get("le", "inf"))
        b[le] = b.get(le, 0.0) + v  # summed over the API kinds (completion, chat)
    for version, b in buckets.items():
        out.setdefault(version, {})["p99_s"] = quantile(0.99, b)
    for row in out.values():
        judged = row.get("accept", 0) + row.get("reject", 0)
        row["acceptance"] = row.get("accept", 0) / judged if judged else None
    return out


def _promql(base: str, query: str, timeout_s: float) -> float | None:
    url = f"{base.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    data = get_json(url, timeout_s, "Prometheus")
    if data.get("status") != "success":
        raise Unexpected(f"Prometheus at {base}: query failed: {data.get('error', data.get('status'))}")
    result = (data.get("data") or {}).get("result") or []
    if not result:
        return None  # no series: nothing scraped yet, or no requests in the window
    try:
        value = float(result[0]["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        raise Unexpected(f"Prometheus at {base}: an answer not shaped like a vector ({str(result)[:80]})") from None
    return None if value != value else value  # NaN: no observations in the window


def gather_gateway(cfg: StatusConfig) -> dict:
    url = _given(cfg.gateway).rstrip("/") + "/metrics"
    t0 = time.monotonic()
    m = scrape(url, cfg.timeout_s, "the gateway's metrics")
    if "flywheel_gateway_requests_total" not in m and "flywheel_replica_healthy" not in m:
        raise Unexpected(f"the gateway's metrics at {url}: no flywheel_gateway_* series (is this a gateway?)")
    out: dict[str, object] = {
        "kafka_up": one(m, "flywheel_kafka_up"),
        "spool_pending_bytes": one(m, "flywheel_event_spool_pending_bytes"),
        "spool_alarm": one(m, "flywheel_event_spool_alarm"),
        "spool_sync_window_s": one(m, "flywheel_event_spool_sync_window_seconds"),
        "events_dropped": total(m, "flywheel_events_total", lambda lb: lb.get("state", "").startswith("dropped")),
        "versions": _per_version(m),
    }
    rate = p99 = None
    if cfg.prometheus:
        try:
            rate = {
                "requests_per_s": _promql(
                    cfg.prometheus, 'sum(rate(flywheel_gateway_requests_total{route=~"/v1/.*"}[1m]))', cfg.timeout_s
                ),
                "errors_per_s": _promql(
                    cfg.prometheus,
                    'sum(rate(flywheel_gateway_requests_total{route=~"/v1/.*",status=~"5.."}[1m])) or vector(0)',
                    cfg.timeout_s,
                ),
                "source": "Prometheus, rate over 1m",
            }
            p99 = {
                "seconds": _promql(
                    cfg.prometheus,
                    "histogram_quantile(0.99, sum by (le) (rate(flywheel_gateway_e2e_latency_seconds_bucket[5m])))",
                    cfg.timeout_s,
                ),
                "source": "Prometheus, over 5m",
            }
        except Unexpected as e:
            out["prometheus_error"] = str(e)
            rate = p99 = None
    if rate is None:
        time.sleep(max(0.0, cfg.sample_s - (time.monotonic() - t0)))
        dt = time.monotonic() - t0
        m2 = scrape(url, cfg.timeout_s, "the gateway's metrics")
        name = "flywheel_gateway_requests_total"
        a, b = total(m, name, user_route) or 0.0, total(m2, name, user_route) or 0.0
        err = lambda lb: user_route(lb) and lb.get("status", "").startswith("5")  # noqa: E731
        ea, eb = total(m, name, err) or 0.0, total(m2, name, err) or 0.0
        rate = {
            "requests_per_s": max(0.0, b - a) / dt,
            "errors_per_s": max(0.0, eb - ea) / dt,
            "source": f"two scrapes {dt:.1f} s apart",
        }
        m = m2
    if p99 is None:
        buckets: dict[float, float] = {}
        for labels, v in m.get("flywheel_gateway_e2e_latency_seconds_bucket", []):
            le = float(labels.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + v
        p99 = {"seconds": quantile(0.99, buckets), "source": "histogram since the gateway started"}
    out["rate"], out["p99"] = rate, p99
    out["requests_total"] = total(m, "flywheel_gateway_requests_total", user_route)
    return out


def gather_trainer(cfg: StatusConfig) -> dict:
    url = _given(cfg.trainer).rstrip("/")
    url = url if url.endswith("/metrics") else url + "/metrics"
    m = scrape(url, cfg.timeout_s, "the trainer's metrics")
    if "flywheel_trainer_step" not in m:
        raise Unexpected(f"the trainer's metrics at {url}: no flywheel_trainer_step (is this the trainer?)")
    by_version: dict[str, dict] = {}
    for name, key in (("flywheel_trainer_reward_mean", "reward_mean"), ("flywheel_trainer_acceptance", "acceptance")):
        for labels, v in m.get(name, []):
            by_version.setdefault(labels.get("version", "?"), {})[key] = v
    last = one(m, "flywheel_trainer_last_publish_timestamp_seconds")
    interval = one(m, "flywheel_trainer_publish_interval_seconds")
    version = one(m, "flywheel_trainer_published_version")
    return {
        "step": int(one(m, "flywheel_trainer_step") or 0),
        "published_version": None if version is None else int(version),
        "kl_per_token": one(m, "flywheel_trainer_kl_per_token"),
        "samples_waiting": one(m, "flywheel_trainer_samples_waiting"),
        "failures": total(m, "flywheel_trainer_failures_total"),
        "last_publish_ts": last if last else None,  # the trainer's start until it first publishes
        "publish_interval_s": interval,
        "next_publish_ts": last + interval if last and interval else None,
        "by_version": by_version,
    }


def fold_activations(activations: list[dict]) -> dict:
    """The store's decisions in sequence order: each version's canary outcome, the stable and pinned ones."""
    canary: dict[int, str] = {}
    stable = pinned = None
    for r in sorted(activations, key=lambda a: seq if isinstance(seq := a.get("seq"), int) else 0):
        kind, v = r.get("type"), r.get("version")
        if kind == "canary" and isinstance(v, int):
            canary[v] = "trial started"  # no outcome recorded (yet): "in trial" once the gateway runs it
        elif kind == "promote" and isinstance(v, int):
            canary[v], stable = "promoted", v
        elif kind == "rollback":
            if isinstance(v, int) and v in canary:
                canary[v] = "rolled back"
            stable = r.get("stable") if isinstance(r.get("stable"), int) else stable
        elif kind == "activate" and isinstance(v, int):
            stable = v
        elif kind == "pin" and isinstance(v, int):
            pinned = v
        elif kind == "unpin":
            pinned = None
    return {"canary": canary, "stable": stable, "pinned": pinned}


def gather_versions(cfg: StatusConfig) -> dict:
    url = _given(cfg.store_url).rstrip("/") + "/versions"
    from weight_sync import fleet_credential

    data = get_json(url, cfg.timeout_s, "the weight store", fleet_credential.headers(cfg.store_token))
    versions, activations = data.get("versions"), data.get("activations", [])
    if not isinstance(versions, list) or not all(isinstance(v, int) for v in versions):
        raise Unexpected(f"the weight store at {url}: no list of versions (is this the store?)")
    folded = fold_activations([a for a in activations if isinstance(a, dict)] if isinstance(activations, list) else [])
    return {
        "count": len(versions),
        "newest": max(versions) if versions else None,
        "stable": folded["stable"],
        "pinned": folded["pinned"],
        "versions": [
            {"version": v, "canary": folded["canary"].get(v)} for v in sorted(versions)[-max(1, cfg.versions) :]
        ],
        "last_activation": activations[-1] if isinstance(activations, list) and activations else None,
    }


def gather_alerts(cfg: StatusConfig) -> dict:
    url = _given(cfg.prometheus).rstrip("/") + "/api/v1/alerts"
    data = get_json(url, cfg.timeout_s, "Prometheus")
    alerts = (data.get("data") or {}).get("alerts") if data.get("status") == "success" else None
    if not isinstance(alerts, list):
        raise Unexpected(
            f"Prometheus at {url}: no list of alerts ({data.get('error', 'status ' + str(data.get('status')))})"
        )
    firing = [
        {
            "name": (a.get("labels") or {}).get("alertname", "?"),
            "severity": (a.get("labels") or {}).get("severity"),
            "summary": (a.get("annotations") or {}).get("summary") or (a.get("annotations") or {}).get("description"),
            "since": a.get("activeAt"),
            "labels": a.get("labels") or {},
        }
        for a in alerts
        if isinstance(a, dict) and a.get("state") == "firing"
    ]
    return {"firing": firing, "pending": sum(isinstance(a, dict) and a.get("state") == "pending" for a in alerts)}


def gather_kafka(cfg: StatusConfig) -> dict:
    from flywheel.status.kafka_lag import consumer_lag

    return consumer_lag(_given(cfg.kafka), cfg.trainer_group, cfg.agent_group_prefix, cfg.timeout_s)


# ----------------------------------------------------------------------------- all of it


def _join_versions(out: dict) -> None:
    """Served replicas and acceptance (the gateway's counters, else the trainer's gauge) beside each version."""
    vs = out.get("versions", {})
    if "versions" not in vs:
        return
    served: dict[int, list[str]] = {}
    for r in out.get("replicas", {}).get("replicas", []):
        if isinstance(r.get("weight_version"), int):
            served.setdefault(r["weight_version"], []).append(r["id"])
    gw = out.get("gateway", {}).get("versions", {})
    tr = out.get("trainer", {}).get("by_version", {})
    trial = (out.get("canary") or {}).get("trial") or {}
    for row in vs["versions"]:
        v = row["version"]
        row["replicas"] = sorted(served.get(v, []))
        g, t = gw.get(str(v), {}), tr.get(str(v), {})
        row["completions"] = g.get("completions")
        row["accepts"], row["rejects"] = g.get("accept"), g.get("reject")
        if g.get("acceptance") is not None:
            row["acceptance"], row["acceptance_source"] = g["acceptance"], "gateway"
        elif t.get("acceptance") is not None:
            row["acceptance"], row["acceptance_source"] = t["acceptance"], "trainer"
        else:
            row["acceptance"], row["acceptance_source"] = None, None
        row["p99_s"] = g.get("p99_s")  # generation latency since the gateway started
        row["reward_mean"] = t.get("reward_mean")
        if trial.get("version") == v:
            row["canary"] = "in trial"


def gather(cfg: StatusConfig) -> dict:
    """Every part, read at once (each in its own thread, so the slowest source sets the time)."""
    jobs = {
        "replicas": (gather_replicas, cfg.gateway, ("gateway", "--gateway", "FLYWHEEL_GATEWAY_URL")),
        "canary": (gather_canary, cfg.gateway, ("gateway", "--gateway", "FLYWHEEL_GATEWAY_URL")),
        "gateway": (gather_gateway, cfg.gateway, ("gateway", "--gateway", "FLYWHEEL_GATEWAY_URL")),
        "kafka": (gather_kafka, cfg.kafka, ("Kafka bootstrap", "--kafka", "FLYWHEEL_KAFKA_BOOTSTRAP")),
        "trainer": (gather_trainer, cfg.trainer, ("trainer metrics URL", "--trainer", "FLYWHEEL_TRAINER_METRICS_URL")),
        "versions": (gather_versions, cfg.store_url, ("weight store", "--store-url", "FLYWHEEL_STORE_URL")),
        "alerts": (gather_alerts, cfg.prometheus, ("Prometheus", "--prometheus", "FLYWHEEL_PROMETHEUS_URL")),
    }
    where = {"gateway": cfg.gateway, "kafka": cfg.kafka, "trainer": cfg.trainer, "store": cfg.store_url}
    out: dict = {"at": time.time(), "sources": {**where, "prometheus": cfg.prometheus}}
    with ThreadPoolExecutor(len(jobs), thread_name_prefix="status") as pool:
        futures = {name: pool.submit(_part, fn, cfg) for name, (fn, given, _) in jobs.items() if given}
        for name, (_, given, why) in jobs.items():
            out[name] = futures[name].result() if given else _not_given(*why)
    try:
        _join_versions(out)
    except Exception as e:  # a part of an unexpected shape: the versions show without what it would add
        out["versions"]["join_error"] = f"{type(e).__name__}: {e}"
    return out


def failed(data: dict) -> list[str]:
    """Parts that were asked for and could not be read."""
    parts = {p: part if isinstance(part := data.get(p), dict) else {"error": "missing"} for p in PARTS}
    return [p for p, part in parts.items() if "error" in part and not part.get("not_given")]
