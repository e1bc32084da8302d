"""A real Prometheus scraping a fleet: `flywheel observe`, and inside `flywheel demo` and `flywheel loadtest`.

Debian's `prometheus` (scripts/setup.sh installs it when missing) on a free loopback port, its data and
generated configuration under the run's directory, small retention, stopped with the run (by PID, and by
the parent-death signal if the run dies). Targets are a file_sd JSON file, which `flywheel observe` rewrites
as the gateway's replicas change (a replica added or moved) without reloading Prometheus. The alert rules are
the repo's (deploy/prometheus/alerts.yml); a run may pass its own (the live test shortens their `for:`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flywheel.observe.alert_rules import ALERTS_FILE
from infra.procs import free_port, spawn, stop_pid, tail, wait_until

# The jobs a fleet has, each scraped at /metrics. sglang: the replicas' own series (--enable-metrics), stored as
# sglang_* (Prometheus 2 asks for OpenMetrics, and prometheus_client then escapes the colon of "sglang:x").
JOBS = ("gateway", "sglang", "agent", "trainer", "store")


@dataclass
class PrometheusConfig:
    data_dir: Path
    port: int = 0  # 0: a free one
    scrape_interval_s: float = 2.0  # a demo lasts minutes: a production 15 s would show a handful of points
    evaluation_interval_s: float = 2.0
    retention: str = "6h"
    rule_files: list[Path] = field(default_factory=lambda: [ALERTS_FILE])
    binary: str = "prometheus"

    def __post_init__(self):
        if self.scrape_interval_s <= 0 or self.evaluation_interval_s <= 0:
            raise ValueError("scrape and evaluation intervals must be positive")


def binary_path(binary: str = "prometheus") -> str | None:
    return shutil.which(binary) or (f"/usr/bin/{binary}" if os.access(f"/usr/bin/{binary}", os.X_OK) else None)


def scrape_config(cfg: PrometheusConfig, sd_file: Path) -> dict:
    """prometheus.yml: one job per component kind, each reading its targets from the file_sd file (filtered by
    the `job` label the file gives each group)."""
    jobs = []
    for job in JOBS:
        jobs.append(
            {
                "job_name": job,
                "scrape_interval": _duration(cfg.scrape_interval_s),
                "scrape_timeout": _duration(min(cfg.scrape_interval_s, 10)),
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "5s"}],
                # Every group names its job; a job keeps only its own.
                "relabel_configs": [{"source_labels": ["__job"], "regex": job, "action": "keep"}],
            }
        )
    return {
        "global": {
            "scrape_interval": _duration(cfg.scrape_interval_s),
            "evaluation_interval": _duration(cfg.evaluation_interval_s),
        },
        "rule_files": [str(Path(p).resolve()) for p in cfg.rule_files],
        "scrape_configs": jobs,
    }


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"  # Prometheus takes whole units only: "0.5s" is refused


def target_groups(targets: dict[str, list[tuple[str, dict]]]) -> list[dict]:
    """{job: [(host:port, labels)]} -> file_sd groups. A label named `__job` selects the scrape job (see
    scrape_config); Prometheus drops double-underscore labels after relabelling."""
    unknown = set(targets) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown scrape jobs {sorted(unknown)}; expected some of {JOBS}")
    return [
        {"targets": [address], "labels": {"__job": job, **labels}}
        for job, entries in targets.items()
        for address, labels in entries
    ]


class Prometheus:
    def __init__(self, cfg: PrometheusConfig):
        self.cfg = cfg
        self.dir = Path(cfg.data_dir).resolve()
        self.sd_file = self.dir / "targets.json"
        self.config_file = self.dir / "prometheus.yml"
        self.log = self.dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    def __enter__(self) -> "Prometheus":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_targets(self, targets: dict[str, list[tuple[str, dict]]]) -> None:
        """Rewrite the file_sd file (atomically: Prometheus may read it at any moment)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(target_groups(targets), indent=1))
        tmp.replace(self.sd_file)

    def start(self, targets: dict[str, list[tuple[str, dict]]] | None = None) -> "Prometheus":
        binary = binary_path(self.cfg.binary)
        if binary is None:
            raise FileNotFoundError(
                "prometheus is not installed: scripts/setup.sh installs Debian's package (apt-get install prometheus)"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        if targets is not None or not self.sd_file.exists():
            self.set_targets(targets or {})
        self.config_file.write_text(yaml.safe_dump(scrape_config(self.cfg, self.sd_file), sort_keys=False))
        port = self.cfg.port or free_port()
        cmd = [
            binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--storage.tsdb.retention.time={self.cfg.retention}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        with open(self.log, "ab") as log:
            self.proc = proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                self._ready, 60, interval=0.3, what=f"prometheus on {self.url}", alive=lambda: proc.poll() is None
            )
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{e}; its log {self.log}:\n{tail(self.log)}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid)
            self.proc = None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # ------------------------------------------------------------------ the HTTP API
    def api(self, path: str, **params) -> Any:  # the response's "data": JSON, its shape by endpoint
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400 on a bad expression: its message says why
            body = json.loads(e.read() or b"{}")
            raise ValueError(f"prometheus {path} {params}: {body.get('error', e)}") from None
        if body.get("status") != "success":
            raise ValueError(f"prometheus {path} {params}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": {...}, "value": [t, "x"]}, ...] (a scalar comes as one row)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def values(self, expr: str, by: str) -> dict[str, float]:
        """{label value: number} of an instant query, keyed by one label."""
        return {row["metric"].get(by, ""): float(row["value"][1]) for row in self.query(expr)}

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def targets_health(self) -> dict[str, list[str]]:
        """{job: [health of each target]} as Prometheus last saw them."""
        out: dict[str, list[str]] = {}
        for t in self.api("targets")["activeTargets"]:
            out.setdefault(t["labels"].get("job", ""), []).append(t["health"])
        return out

    def wait_scraped(self, jobs: tuple[str, ...], timeout_s: float = 60.0) -> None:
        """Until every target of these jobs has been scraped once and is up."""

        def all_up() -> bool:
            health = self.targets_health()
            return all(health.get(j) and all(h == "up" for h in health[j]) for j in jobs)

        wait_until(all_up, timeout_s, interval=0.5, what=f"prometheus scraping {jobs} ({self.url}/targets)")


def hostport(url: str) -> str:
    """A scrape target's address from a URL (or an address already)."""
    return urllib.parse.urlsplit(url if "//" in url else f"http://{url}").netloc


def fleet_targets(fleet, trainer_metrics: str | None = None) -> dict[str, list[tuple[str, dict]]]:
    """What a LocalFleet (and the demo's trainer) exposes: its gateway(s), replicas, agents, store."""
    targets: dict[str, list[tuple[str, dict]]] = {
        "gateway": [(hostport(u), {}) for u in fleet.gateway_urls()],
        "sglang": [(hostport(r.url), {"replica": f"r{i}"}) for i, r in enumerate(fleet.replicas)],
        "agent": [(addr, {"replica": name}) for name, addr in sorted(fleet.agent_metrics.items())],
        "store": [(hostport(fleet.store_url), {})] if fleet.store_url else [],
    }
    if trainer_metrics:
        targets["trainer"] = [(trainer_metrics, {})]
    return targets


def start_for_fleet(fleet, data_dir: Path, trainer_metrics: str | None = None, say=print) -> Prometheus | None:
    """A Prometheus scraping a LocalFleet for a run (demo, load test), or None, said why: observing a run is
    not worth failing it."""
    prom = Prometheus(PrometheusConfig(data_dir=data_dir))
    try:
        prom.start(fleet_targets(fleet, trainer_metrics))
    except (OSError, TimeoutError, RuntimeError) as e:
        say(f"prometheus not started: {e}")
        prom.stop()
        return None
    say(f"prometheus {prom.url}  (scraping {', '.join(JOBS)}; alerts {prom.url}/alerts)")
    return prom


def sleep_scrapes(cfg: PrometheusConfig, n: int = 2) -> None:
    """Long enough for n more scrapes (a final count reaches Prometheus before it is compared)."""
    time.sleep(n * cfg.scrape_interval_s + 0.5)


def alerts_seen(prom: Prometheus) -> list[dict] | str:
    """Every alert pending or firing at some point of the run (Prometheus' own ALERTS series), by name and
    state; a sentence when Prometheus could not be asked."""
    try:
        rows = prom.query("max_over_time(ALERTS[1d])")
    except (OSError, ValueError) as e:
        return f"could not ask prometheus: {e}"
    seen = {(r["metric"].get("alertname"), r["metric"].get("alertstate")) for r in rows}
    return [{"alert": a, "state": s} for a, s in sorted(seen)]
