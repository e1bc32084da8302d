"""`flywheel observe`: a Prometheus (flywheel.observe.prometheus) scraping a running fleet until Ctrl-C, and the check
the demo makes at its end: its per-version table against PromQL over the gateway's per-version series.

The fleet is found from its gateway: `/admin/replicas` names the SGLang replicas (re-read every few seconds,
so a replica added or restarted is scraped); agents, trainer and store are given as flags or env.
"""

from __future__ import annotations

import argparse
import bisect
import time
from dataclasses import dataclass
from pathlib import Path

from flywheel.observe.prometheus import Prometheus, PrometheusConfig, hostport
from infra.config import option

JUDGED = 'sum by (version) (flywheel_gateway_version_feedback_total{kind=~"accept|reject"})'
# A version nobody accepted has no accept series: 0 of its judged, not no answer.
ACCEPTANCE = f'(sum by (version) (flywheel_gateway_version_feedback_total{{kind="accept"}}) or {JUDGED} * 0) / {JUDGED}'
# The demo's p99 is its autocomplete users' (/v1/completions): the agent's chat turns are another class.
P99 = (
    "histogram_quantile(0.99, sum by (version, le) "
    '(flywheel_gateway_version_latency_seconds_bucket{kind="completion"}))'
)


@dataclass
class ObserveConfig:
    gateway: str = option("", help="the gateway's URL", env="FLYWHEEL_GATEWAY_URL")
    admin_token: str = option("", help="the gateway's admin token", env="FLYWHEEL_ADMIN_TOKEN", cli=False)
    agents: str = option("", help="weight agents' /metrics: name=host:port,...", env="FLYWHEEL_AGENT_METRICS")
    trainer: str = option("", help="the trainer's /metrics URL", env="FLYWHEEL_TRAINER_METRICS_URL")
    store: str = option("", help="the weight store's URL", env="FLYWHEEL_STORE_URL")
    out_dir: Path = option(Path("observe_out"), help="Prometheus' data and generated configuration")
    port: int = option(0, help="Prometheus' port (0: a free one)")
    minutes: float = option(0.0, help="stop after this long (0: at Ctrl-C)")
    scrape_interval_s: float = option(5.0, help="seconds between scrapes")

    def __post_init__(self):
        if not self.gateway:
            raise ValueError("observe needs the gateway's URL (--gateway or $FLYWHEEL_GATEWAY_URL)")


def register(sub: argparse._SubParsersAction) -> None:
    from infra.config import add_flags, build

    p = sub.add_parser("observe", help="run Prometheus scraping a running fleet (its alerts, PromQL) until Ctrl-C")
    add_flags(p, ObserveConfig)
    p.set_defaults(func=lambda a: run(build(ObserveConfig, a)))


def targets(cfg: ObserveConfig) -> dict[str, list[tuple[str, dict]]]:
    from admin_api import routes
    from admin_api.client import AdminClient

    try:
        answer = AdminClient(cfg.gateway, cfg.admin_token).replicas()
        replicas = [(hostport(r["url"]), r["id"]) for r in answer["replicas"]]
    except (OSError, ValueError, KeyError, TypeError) as e:  # down, a wrong token, not a gateway
        where = f"{cfg.gateway}{routes.LIST_REPLICAS.path}"
        raise RuntimeError(f"cannot read the replicas from the gateway at {where}: {e}") from None
    agents = [pair.split("=", 1) for pair in cfg.agents.split(",") if pair]
    if any(len(a) != 2 for a in agents):
        raise ValueError(f"--agents takes name=host:port,...; got {cfg.agents!r}")
    return {
        "gateway": [(hostport(cfg.gateway), {})],
        "sglang": [(addr, {"replica": rid}) for addr, rid in replicas],
        "agent": [(addr, {"replica": name}) for name, addr in agents],
        "trainer": [(hostport(cfg.trainer), {})] if cfg.trainer else [],
        "store": [(hostport(cfg.store), {})] if cfg.store else [],
    }


def run(cfg: ObserveConfig) -> int:
    prom = Prometheus(
        PrometheusConfig(
            data_dir=Path(cfg.out_dir) / "prometheus",
            port=cfg.port,
            scrape_interval_s=cfg.scrape_interval_s,
            evaluation_interval_s=cfg.scrape_interval_s,
        )
    )
    prom.set_targets(targets(cfg))
    with prom:
        print(f"prometheus {prom.url}  (alerts {prom.url}/alerts, targets {prom.url}/targets; data {prom.dir})")
        deadline = time.monotonic() + 60 * cfg.minutes if cfg.minutes else float("inf")
        try:
            while time.monotonic() < deadline:
                time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
                try:
                    prom.set_targets(targets(cfg))
                except RuntimeError as e:  # the gateway away for a moment: keep the last targets
                    print(f"observe: could not re-read the fleet's replicas: {e}")
        except KeyboardInterrupt:
            pass
    print("prometheus stopped")
    return 0


# ---------------------------------------------------------------------- the demo's check
def bucket_index(seconds: float, buckets=None) -> int:
    from serving.metrics import LATENCY_BUCKETS

    return bisect.bisect_left(list(buckets or LATENCY_BUCKETS), seconds)


def crosscheck(prom: Prometheus, rows: list[dict], min_judged: int = 30) -> list[dict]:
    """Per version: the demo's acceptance, judged count and p99 beside Prometheus' own.

    They agree when acceptance is within 2 points and the judged counts within 2% (the gateway counts the
    same feedback the users sent; a request in flight at a scrape or a feedback still in the air may differ),
    and the p99s fall in the same or an adjacent histogram bucket (Prometheus interpolates inside a bucket;
    the demo's is measured at the client, the gateway's from dispatch to the replica's answer). Versions with
    fewer than min_judged judged requests are listed, not judged."""
    acc = prom.values(ACCEPTANCE, "version")
    judged = prom.values(JUDGED, "version")
    p99 = prom.values(P99, "version")
    out = []
    for r in rows:
        v = str(r["version"])
        row = {
            "version": r["version"],
            "acceptance_demo": r["acceptance"],
            "acceptance_prom": None if v not in acc else round(acc[v], 4),
            "judged_demo": r["judged"],
            "judged_prom": None if v not in judged else int(judged[v]),
            "p99_ms_demo": r["p99_ms"],
            "p99_ms_prom": None if v not in p99 or p99[v] != p99[v] else round(1000 * p99[v], 1),
        }
        if r["judged"] < min_judged:
            row["agree"] = None
        else:
            row["agree"] = (
                row["acceptance_prom"] is not None
                and abs(row["acceptance_prom"] - r["acceptance"]) <= 0.02
                and abs(row["judged_prom"] - r["judged"]) <= max(2, 0.02 * r["judged"])
                and row["p99_ms_prom"] is not None
                and abs(bucket_index(row["p99_ms_prom"] / 1000) - bucket_index(r["p99_ms"] / 1000)) <= 1
            )
        out.append(row)
    return out


def crosscheck_table(rows: list[dict]) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    lines = ["version  accept demo / prom   judged demo / prom   p99 ms demo / prom   agree"]
    for r in rows:
        agree = {True: "yes", False: "NO", None: "(few judged)"}[r["agree"]]
        lines.append(
            f"{'v' + str(r['version']):>7}  {f(r['acceptance_demo'], '.1%'):>7} / {f(r['acceptance_prom'], '.1%'):<7}"
            f"  {r['judged_demo']:>6} / {f(r['judged_prom'], 'd'):<6}       {f(r['p99_ms_demo'], '.0f'):>6} / "
            f"{f(r['p99_ms_prom'], '.0f'):<6}     {agree}"
        )
    return "\n".join(lines)
