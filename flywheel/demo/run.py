"""`flywheel demo`: the whole loop on one machine, ending by itself.

    model      the demo checkpoint (built and cached on first use, ~6 min)
    fleet      Kafka broker, weight store (v0), 2 SGLang replicas on CPU, the gateway, one agent per replica
    trainer    `flywheel train`: learns from the completions + feedback stream, publishes every interval
    gate       with --gate: `flywheel gate --follow` judges each version before the fleet hears of it
               (flywheel.demo.gate: one torch thread, niced below serving)
    users      a simulated IDE population with a hidden preference (flywheel.demo.population)
    loop       until `versions` new versions are published and served, or the time bound
    report     a table per version (acceptance, requests, latency, switch pause, delta, the gate's verdict and
               seconds), demo_out/summary.json,
               demo_out/acceptance.png; exit 0 when acceptance rose `goal_points` with zero failed requests

Everything started here is stopped here, by PID; the output directory is started afresh each run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.config import check_modes, option

# On by measurement (docs/canary.md, "The eval gate in the demo"; test preset, 2 shared cores, beside the serving
# fleet): every judgement ended within the 75 s publish interval (the first, two suites, in 51-61 s; later ones in
# 25-32 s). It delays each version by one judgement: an 8-minute run met the goal, 4-minute runs fell short of it.
GATE_DEFAULT = True


@dataclass
class DemoConfig:
    preset: Literal["test", "demo"] = option("demo", help="the base model to build (or take from the cache)")
    seed: int = option(0, help="of the model, the users and their preferences")
    out_dir: Path = option(Path("demo_out"), help="logs, interactions, summary and figures")
    users: int = option(6, help="simulated IDE users (autocomplete)")
    agents: int = option(1, help="agent users: short tool-using sessions (read, write, run tests)")
    agent_api: Literal["chat", "messages"] = option(
        "messages",
        help="how agent users talk: messages (the Messages API, no feedback: the gateway reads implicit signals) "
        "or chat (the chat API, with feedback on each whole session)",
    )
    agent_mined_share: float = option(
        0.0, help="share of agent sessions on mined tasks (`flywheel tasks mine`), judged by the repository's own tests"
    )
    agent_mined_tasks: Path | None = option(
        None,
        help="a tasks.jsonl, or a folder of them, for those sessions (None: $FLYWHEEL_HOME/tasks: body and feature)",
    )
    mined_rewards_forgeable_ok: bool = option(
        False,
        help="run agent sessions on mined tasks although an agent can forge their reward (their tests share its "
        "process); required with --agent-mined-share",
    )
    versions: int = option(6, help="new versions to publish and serve before stopping")
    minutes: float = option(13.0, help="bound on the loop (setup aside); a first run also builds the model")
    publish_interval_s: float = option(75.0, help="seconds between published versions")
    lr: float = option(1e-4, help="the trainer's learning rate")
    temperature: float = option(1.0, help="the users' sampling temperature")
    replicas: int = option(2, help="SGLang replicas")
    goal_points: float = option(20.0, help="acceptance rise (points) the demo must reach")
    feedback: Literal["basic", "persist", "text"] = option(
        "basic",
        help="what users send and the trainer learns from: basic (accept/reject), persist (+ whether accepted code "
        "is kept), text (+ comments with hints, distilled)",
    )
    # 0 by default: the demo as it was measured (its 20-point goal is on immediate acceptance, which fooled
    # accepts inflate); with persist or text, 0.25 gives the persisted checks something to say.
    fooled_rate: float = option(0.0, help="share of failing completions users accept at a glance (deleted later)")
    families: Literal["single", "multiline", "all"] = option(
        "single", help="task families users ask about: single (one-line bodies), multiline, all (the demo model's)"
    )
    observe: bool = option(True, help="run Prometheus on the fleet and check the per-version table against PromQL")
    gate: bool = option(
        GATE_DEFAULT,
        help="judge every version on the eval gate's held-out suite before the fleet hears of it (the trainer "
        "with --gate, `flywheel gate --follow` beside it; a blocked version stays blocked, the next is judged)",
    )
    gate_threads: int = option(1, help="torch threads of the gate (it runs niced below serving: spare capacity)")

    def __post_init__(self):
        check_modes(self)
        if self.agent_mined_share > 0 and not self.mined_rewards_forgeable_ok:
            raise ValueError(
                "agent sessions on mined tasks (--agent-mined-share) are judged by tests that run in the agent's "
                "code's own process, which it can game; say --mined-rewards-forgeable-ok to train on them anyway "
                "(docs/sandbox.md)"
            )
        if self.gate_threads < 1:
            raise ValueError(f"--gate-threads: the gate needs at least one torch thread, not {self.gate_threads}")


def register(sub: argparse._SubParsersAction) -> None:
    from infra.config import add_flags, build

    p = sub.add_parser("demo", help="run the whole loop on this machine (see docs/getting-started.md)")
    add_flags(p, DemoConfig)
    p.set_defaults(func=lambda a: run(build(DemoConfig, a)))


FEEDBACK_MODES = {
    "basic": "accept/reject only",
    "persist": "accept/reject + whether accepted code is kept",
    "text": "accept/reject + kept + comments distilled",
}


def _trainer(cfg: DemoConfig, fleet, model: Path, out: Path, metrics_port: int) -> subprocess.Popen:
    from infra.paths import REPO_ROOT
    from infra.procs import spawn

    cmd = [
        sys.executable,
        "-m",
        "flywheel",
        "train",
        "--model",
        str(model),
        "--work-dir",
        str(out / "trainer"),
        "--kafka",
        fleet.broker.bootstrap,
        "--publish-interval",
        str(cfg.publish_interval_s),
        "--store",
        str(fleet.store_root),
        "--key",
        str(fleet.signing_key),
        "--store-url",
        fleet.store_url,
        "--lr",
        str(cfg.lr),
        "--threads",
        "1",
        "--feedback",
        cfg.feedback,
        # Demo-scale windows: persisted checks come 20-40 s after an accept, comments 2 s after a reject.
        "--delayed-window",
        "90",
        "--comment-wait",
        "20",
        "--metrics-port",
        str(metrics_port),
        *(["--gate"] if cfg.gate else []),  # versions after v0 wait in the store for the gate's verdict
    ]
    env = {**os.environ, **fleet.kafka_env("trainer")}  # it logs in to Kafka as the trainer, not as the operator
    with open(out / "logs" / "trainer.log", "ab") as log:  # the child keeps its own copy of the descriptor
        return spawn(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def _line(t0: float, pop, fleet) -> str:
    from weight_sync.store.server import Store

    recs = pop.snapshot()
    recent = [r for r in recs[-150:] if r.outcome in ("accept", "reject") and r.kind == "autocomplete"]
    acc = sum(r.outcome == "accept" for r in recent) / len(recent) if recent else float("nan")
    sessions = [r for r in recs if r.kind == "agent" and r.outcome in ("accept", "reject")][-20:]
    kept = sum(r.outcome == "accept" for r in sessions)
    serving = ",".join(str(v) for v in sorted({v for v in fleet.served_versions().values() if v is not None}))
    published = max(Store(fleet.store_root).versions(), default=0)
    failed = sum(r.outcome == "failed" for r in recs)
    return (
        f"[{time.monotonic() - t0:5.0f}s] published v{published}, fleet serves v{serving}, {len(recs)} requests "
        f"({failed} failed), acceptance of the last {len(recent)} judged: {acc:.0%}, agent sessions kept "
        f"{kept}/{len(sessions)}"
    )


def run(cfg: DemoConfig) -> int:
    from flywheel.demo import gate as demo_gate, report as demo_report
    from flywheel.demo.population import Population, PopulationConfig
    from flywheel.local_fleet import LocalFleet, LocalFleetConfig
    from flywheel.observe.prometheus import alerts_seen, start_for_fleet
    from infra.procs import free_port, stop_pid
    from online_rl.model.bootstrap import bootstrap, report
    from weight_sync.store.server import Store

    out = Path(cfg.out_dir).resolve()
    if out.exists():
        shutil.rmtree(out)  # a fresh broker, store and trainer: acceptance starts from the base model
    (out / "logs").mkdir(parents=True)
    t_setup = time.monotonic()
    model = bootstrap(cfg.preset, cfg.seed)
    base = report(model)
    print(
        f"model   {model}  ({base['parameters']:,} parameters; held-out pass rate greedy "
        f"{base['eval']['pass_rate_greedy']:.0%}, temperature 1 {base['eval']['pass_rate_t1']:.0%})"
    )
    trainer = gate = pop = prom = None
    checked = alerts = None  # from Prometheus: the per-version table against PromQL, the alerts of the run
    fleet = LocalFleet(
        LocalFleetConfig(model=model, out_dir=out / "fleet", replicas=cfg.replicas, tenants=cfg.users + cfg.agents)
    )
    try:
        fleet.start()
        trainer_port = free_port()
        trainer = _trainer(cfg, fleet, model, out, trainer_port)
        print(f"trainer pid {trainer.pid}, publishes every {cfg.publish_interval_s:.0f}s (log {out}/logs/trainer.log)")
        if cfg.gate:
            gate = demo_gate.start_follower(fleet, out, cfg.gate_threads)
            print(
                f"gate    pid {gate.pid}, judges each version before the fleet hears of it ({cfg.gate_threads} "
                f"torch thread(s), niceness {demo_gate.NICENESS}; log {out}/logs/gate.log)"
            )
        if cfg.observe:
            prom = start_for_fleet(fleet, out / "prometheus", f"127.0.0.1:{trainer_port}")
        pop = Population(
            PopulationConfig(
                users=cfg.users,
                agents=cfg.agents,
                agent_api=cfg.agent_api,
                mined_share=cfg.agent_mined_share,
                mined_tasks=str(cfg.agent_mined_tasks) if cfg.agent_mined_tasks else None,
                mined_rewards_forgeable_ok=cfg.mined_rewards_forgeable_ok,
                temperature=cfg.temperature,
                seed=cfg.seed,
                feedback=cfg.feedback,
                fooled_rate=cfg.fooled_rate,
                families=cfg.families,
            ),
            fleet.gateway.url,
            list(fleet.keys.values()),
        ).start()
        print(
            f"users   {cfg.users} simulated IDE users and {cfg.agents} agent users (hidden preference: the "
            f"function passes its hidden tests; {cfg.fooled_rate:.0%} of failing ones accepted at a glance)"
        )
        print(f"feedback {cfg.feedback}: {FEEDBACK_MODES[cfg.feedback]}")
        print(
            f"setup took {time.monotonic() - t_setup:.0f}s; running until v{cfg.versions} is served "
            f"or {cfg.minutes:.0f} min\n"
        )
        t0 = time.monotonic()
        deadline = t0 + 60 * cfg.minutes
        next_line = t0
        while time.monotonic() < deadline:
            if trainer.poll() is not None:
                raise RuntimeError(f"the trainer exited ({trainer.returncode}); see {out}/logs/trainer.log")
            if gate is not None and gate.poll() is not None:  # it outlives a version's failure; not its own exit
                raise RuntimeError(f"the gate exited ({gate.returncode}); see {out}/logs/gate.log")
            if time.monotonic() >= next_line:
                print(_line(t0, pop, fleet), flush=True)
                next_line += 15
            newest = [  # at or past the last version: the gate may have blocked it, and the next one passed
                r
                for r in pop.snapshot()
                if r.version is not None
                and r.version >= cfg.versions
                and r.outcome in ("accept", "reject")
                and r.kind == "autocomplete"
            ]
            if len(newest) >= 60:  # the last version has served enough judged requests to measure
                break
            time.sleep(1)
        print(_line(t0, pop, fleet))
    finally:
        if pop is not None:
            pop.stop()
            pop.write(out / "interactions.jsonl")
        if prom is not None:
            try:
                if pop is not None:
                    checked = _crosscheck(prom, pop)
                    alerts = alerts_seen(prom)
            except Exception as e:  # observing is not worth the verdict, nor the cleanup below
                print(f"prometheus cross-check failed: {type(e).__name__}: {e}")
            finally:
                prom.stop()
        if gate is not None:
            stop_pid(gate.pid, timeout=30)
        if trainer is not None:
            stop_pid(trainer.pid, timeout=60)
        switches = fleet.switch_reports()
        signals = _implicit_signals(fleet)
        fleet.stop()
    store = Store(fleet.store_root)
    gates = demo_gate.verdicts(fleet.store_root) if cfg.gate else {}
    manifests = {v: store.manifest(v) for v in store.versions()}
    rows = demo_report.summarize(pop.snapshot(), switches, manifests, signals, gates)
    verdict = demo_report.verdict(rows, goal_points=cfg.goal_points)
    verdict["feedback"] = cfg.feedback
    verdict["signals_sent"] = pop.signals_sent
    verdict["signals_dropped"] = pop.signals_dropped  # still due when the users stopped
    verdict["implicit_signals"] = _signal_quality(pop, signals)
    if checked is not None:
        verdict["prometheus_crosscheck"] = checked
    if alerts is not None:
        verdict["alerts_seen"] = alerts
    if cfg.gate:
        from online_rl.gate.cli import waiting

        verdict["gate"] = demo_gate.summary(gates, waiting(store), cfg.publish_interval_s)
    demo_report.write(rows, verdict, out)
    if (out / "trainer" / "history.json").exists():  # what the trainer learnt from, by version
        from online_rl.plots import reward_by_version

        try:
            reward_by_version(out / "trainer" / "history.json", out / "reward_by_version.png")
        except (ValueError, OSError) as e:  # a figure is not worth the verdict
            print(f"reward_by_version.png not drawn: {e}")
    print("\n" + demo_report.table(rows))
    if checked is not None:
        from flywheel.observe.command import crosscheck_table

        print(
            "\nthe same, from Prometheus (PromQL over the gateway's per-version series):\n" + crosscheck_table(checked)
        )
    if alerts is not None:
        named = ", ".join(f"{a['alert']} ({a['state']})" for a in alerts) if isinstance(alerts, list) else alerts
        print(f"alerts during the run: {named or 'none'}")
    if cfg.gate:
        print(demo_gate.line(verdict["gate"]))
    rise = "-" if verdict["rise_points"] is None else format(verdict["rise_points"], "+")
    print(
        f"\nacceptance v{verdict['base_version']} {_pct(verdict['base_acceptance'])} -> "
        f"v{verdict['final_version']} {_pct(verdict['final_acceptance'])} ({rise} points; goal "
        f"+{cfg.goal_points:.0f}), {verdict['failed_requests']} failed requests: "
        f"{'GOAL MET' if verdict['goal_met'] else 'goal missed'}"
    )
    to90 = verdict["requests_to_90"]
    print(
        f"feedback {cfg.feedback} ({FEEDBACK_MODES[cfg.feedback]}; sent {verdict['signals_sent']['comment']} comments, "
        f"{verdict['signals_sent']['persisted']} persisted checks): kept share reached 90% "
        + (f"after {to90} judged requests" if to90 is not None else "in no version")
    )
    print(
        f"wrote {out}/summary.json, {out}/acceptance.png, {out}/reward_by_version.png, {out}/interactions.jsonl; "
        "everything started was stopped"
    )
    return 0 if verdict["goal_met"] else 1


def _crosscheck(prom, pop) -> list[dict] | None:
    """After the users stopped and before the fleet does: the last feedback scraped, then the comparison."""
    from flywheel.demo import report as demo_report
    from flywheel.observe.command import crosscheck
    from flywheel.observe.prometheus import sleep_scrapes

    sleep_scrapes(prom.cfg)
    try:
        return crosscheck(prom, demo_report.summarize(pop.snapshot(), [], {}))
    except (OSError, ValueError) as e:
        print(f"prometheus cross-check failed: {e}")
        return None


def _implicit_signals(fleet) -> list[tuple[str, str]]:
    """(signal, completion id) of every implicit feedback the gateway logged (from Kafka, before it stops)."""
    from contracts import events as ev
    from infra.kafka_admin import records_to_end

    if fleet.broker is None:
        return []
    time.sleep(2.0)  # the gateway ships its spool about every second
    out = []
    try:
        for r in records_to_end(fleet.broker.bootstrap, ev.TOPIC_FEEDBACK):
            try:
                f = ev.decode(r.value)
            except ev.SchemaError:
                continue
            if isinstance(f, ev.FeedbackEvent) and f.kind == ev.IMPLICIT:
                out.append((f.signal, f.completion_id))
    except Exception as e:  # noqa: BLE001 - a figure is not worth the cleanup
        print(f"implicit signals not read from Kafka: {type(e).__name__}: {e}")
    return out


def _signal_quality(pop, signals: list[tuple[str, str]]) -> dict:
    """The implicit signals' precision and recall against the agent users' truth (flywheel.demo.signal_quality)."""
    from flywheel.demo.signal_quality import SessionTruth, score

    sessions = [
        SessionTruth(list(r.turn_versions), r.truth, r.writes or [], "abandoned" in (r.reactions or []))
        for r in pop.snapshot()
        if r.kind == "agent" and r.truth is not None and r.turn_versions is not None
    ]
    return score(sessions, signals)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
