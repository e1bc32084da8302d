"""`flywheel loadtest SCENARIO`: run one locust scenario headless and judge it.

Against a deployed fleet (`--gateway`; its API keys in FLYWHEEL_LOADTEST_KEYS and admin token in
FLYWHEEL_ADMIN_TOKEN, never flags; plus the environment of
loadtests.scenario for actions), or, without `--gateway`, against a fleet it starts here (broker, store,
replicas, gateway, agents; loadtests.versions makes the checkpoints to publish). Writes, under --out:
locust's CSV stats (locust_stats.csv, locust_stats_history.csv, locust_failures.csv), requests.csv,
marks.json, result.json and latency.png. Exit code 0 = pass.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.config import option
from infra.paths import REPO_ROOT

# How long past its run time a scenario may still be acting (loadtests.scenario: each action has its own timeouts,
# three publishes and their waits fit); then the run fails. This command's limit on locust is that and a margin.
SCENARIO_OVERRUN_S = 900.0

SCENARIOS = {
    "steady": "steady.py",
    "hot-switch": "hot_switch.py",
    "rollback": "rollback.py",
    "broker-outage": "broker_outage.py",
}
LOCUSTFILES = Path(__file__).parent / "locustfiles"


@dataclass
class LoadTestConfig:
    """`flywheel loadtest`'s options (infra.config: one flag per option; secrets from the environment only)."""

    scenario: str
    users: int = option(8, help="locust users")
    # The flag: --duration, with its unit (loadtests.cli). A scenario's run goes on past it while an action
    # (a publish and its wait for the fleet) is still going.
    duration_s: float = 90.0
    spawn_rate: float = option(4.0, help="users started per second")
    out_dir: Path = option(Path("loadtest_out"), flag="out", help="where the results go")
    p99_multiple: float = option(2.0, help="allowed p99 after the first action, as a multiple of the p99 before it")
    gateway: str | None = option(
        None, env="FLYWHEEL_GATEWAY_URL", help="a deployed gateway (None: start a local fleet)"
    )
    keys: str | None = option(None, env="FLYWHEEL_LOADTEST_KEYS", cli=False, help="the users' API keys")
    admin_token: str | None = option(None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the gateway's admin token")
    preset: Literal["test", "demo"] = option("demo", help="model of the local fleet")
    replicas: int = option(2, help="replicas of the local fleet")
    observe: bool = option(
        True, help="a local fleet: Prometheus scrapes it, and the alerts that fired go in result.json"
    )


def parse_duration(text: str) -> float:
    text = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise ValueError(f"bad duration {text!r}: use seconds, or a number with s, m or h (e.g. 90s, 5m)") from None


def locust_command(cfg: LoadTestConfig, host: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILES / SCENARIOS[cfg.scenario]),
        "--headless",
        "-u",
        str(cfg.users),
        "-r",
        str(cfg.spawn_rate),
        "-t",
        f"{int(cfg.duration_s)}s",
        "--host",
        host,
        "--csv",
        str(out / "locust"),
        "--csv-full-history",
        "--only-summary",
        "--stop-timeout",
        "60",
        "--loglevel",
        "WARNING",
    ]


def _local_env(fleet, model: Path, out: Path) -> dict[str, str]:
    from loadtests import versions

    made, prev = [], model
    for i in range(1, 4):  # chained, as a trainer's versions are
        prev = versions.nudged(prev, out / "versions" / f"good-{i}", seed=i)
        made.append(str(prev))
    bad = versions.broken(model, out / "versions" / "bad", seed=99)
    kafka = [sys.executable, "-m", "flywheel", "kafka"]
    data = str(fleet.out / "kafka")
    return {
        **fleet.env(),
        "FLYWHEEL_LOADTEST_VERSIONS": ",".join(made),
        "FLYWHEEL_LOADTEST_BAD_VERSION": str(bad),
        "FLYWHEEL_BROKER_STOP_CMD": " ".join([*kafka, "stop", "--data-dir", data]),
        "FLYWHEEL_BROKER_START_CMD": " ".join([*kafka, "start", "--data-dir", data]),
    }


def run(cfg: LoadTestConfig) -> int:
    from loadtests import kafka_check
    from loadtests.plot import plot

    if cfg.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {cfg.scenario!r}; choose from {', '.join(SCENARIOS)}")
    out = Path(cfg.out_dir).resolve() / cfg.scenario
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    fleet = prom = None
    try:
        if cfg.gateway:
            if not cfg.keys:
                raise ValueError("a deployed fleet needs FLYWHEEL_LOADTEST_KEYS (its API keys, comma-separated)")
            env = {
                "FLYWHEEL_GATEWAY_URL": cfg.gateway,
                "FLYWHEEL_LOADTEST_KEYS": cfg.keys,
                **({"FLYWHEEL_ADMIN_TOKEN": cfg.admin_token} if cfg.admin_token else {}),
            }
            host = cfg.gateway
        else:
            from flywheel.local_fleet import LocalFleet, LocalFleetConfig
            from online_rl.model.bootstrap import bootstrap

            model = bootstrap(cfg.preset, 0)
            fleet = LocalFleet(
                LocalFleetConfig(model=model, out_dir=out / "fleet", replicas=cfg.replicas, tenants=max(1, cfg.users))
            )
            fleet.start()
            if cfg.observe:
                from flywheel.observe.prometheus import start_for_fleet

                prom = start_for_fleet(fleet, out / "prometheus")
            env = _local_env(fleet, model, out)
            host = fleet.gateway.url
        env = {
            **os.environ,
            **env,
            "PYTHONPATH": str(REPO_ROOT),
            "FLYWHEEL_LOADTEST_OUT": str(out),
            "FLYWHEEL_LOADTEST_P99_MULTIPLE": str(cfg.p99_multiple),
        }
        cmd = locust_command(cfg, host, out)
        print(f"locust  {cfg.scenario}: {cfg.users} users for {cfg.duration_s:.0f}s against {host}", flush=True)
        t, t_start = time.monotonic(), time.time()
        with open(out / "locust.log", "wb") as log:
            # Its own group: a limit reached kills locust and what its scenario started (a publish in flight).
            proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=cfg.duration_s + SCENARIO_OVERRUN_S + 120)
            except BaseException:  # the limit, or Ctrl-C: its own session no longer hears the terminal's signal
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        print(f"locust  finished in {time.monotonic() - t:.0f}s (exit {rc})")
        result_path = out / "result.json"
        if not result_path.exists():
            raise RuntimeError(
                f"locust wrote no result (exit {rc}); see {out / 'locust.log'}:\n"
                + (out / "locust.log").read_text()[-3000:]
            )
        result = json.loads(result_path.read_text())
        if cfg.scenario == "broker-outage":
            issued = [json.loads(line) for line in (out / "issued.jsonl").read_text().splitlines() if line]
            bootstrap_servers = env.get("FLYWHEEL_KAFKA_BOOTSTRAP")
            if not bootstrap_servers:
                raise ValueError("broker-outage checks Kafka afterwards: set FLYWHEEL_KAFKA_BOOTSTRAP")
            check = kafka_check.all_delivered(
                host,
                bootstrap_servers,
                {x["id"] for x in issued if "id" in x},
                since=t_start,
                turn_ids={i for x in issued for i in x.get("ids", [])},
                session_ids={x["session"] for x in issued if x.get("session")},
            )
            result["kafka"] = check
            if not check["complete"]:
                result["passed"] = False
                result["reasons"] = result.get("reasons", []) + [
                    f"events missing from Kafka: {check['missing_completions']} completions, "
                    f"{check['missing_feedback']} feedback"
                ]
            result_path.write_text(json.dumps(result, indent=1))
        if prom is not None:
            from flywheel.observe.prometheus import alerts_seen

            result["alerts_seen"] = alerts_seen(prom)
            result_path.write_text(json.dumps(result, indent=1))
        png = plot(out, f"{cfg.scenario}: {cfg.users} users, {cfg.duration_s:.0f}s")
    finally:
        if prom is not None:
            prom.stop()
        if fleet is not None:
            fleet.stop()
    passed = result["passed"] and rc == 0
    print(
        f"{'PASS' if passed else 'FAIL'} {cfg.scenario}: {result['requests']} requests, {result['failures']} failed, "
        f"p99 {result['p99_before_ms']} ms before / {result['p99_after_ms']} ms after the first action "
        f"(allowed {cfg.p99_multiple}x)" + ("" if passed else f"; {'; '.join(result['reasons'])}")
    )
    print(f"wrote {out}/result.json, {png}, locust CSVs")
    return 0 if passed else 1
