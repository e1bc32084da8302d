"""Guards before users: the eval gate (online_rl.gate) on real versions of the test model.

The fleet serves the test preset's base model (v0). Three candidates are published with the gate on (in the store,
not announced) and each is judged against v0 by `run_gate`, the code `flywheel gate` runs: the same weights
published again (equal: must pass), a copy with Gaussian noise of 0.3 times each tensor's std (degraded: the canary
benchmark's "worse by degree"; its verdict is reported, not required), and every weight scrambled
(loadtests.versions.broken: must be blocked). The suite runs in this process on the held-out tasks (16 tasks and 4
agent sessions, 4 temperature-1 samples each: 64 completions and 48 tool-call answers per version); no broker, so the
signed gate records go to the store's ledger only (the integration test, tests/integration/online_rl/gate, checks
them on Kafka). Every figure comes from these runs. As `flywheel gate` does, the served version's suite runs once,
with the first candidate (gate_seconds_first_version: both suites); gate_seconds_per_version is the median wall time
of the later gates (rebuilding the candidate from the store, its suite, the verdict, the record), the steady cost of
one more version; on 2 cores shared with other work (the load average before and after is reported).

Guarding the delta codec's regime too (issue #51): `preset_identical_share` (the mean share of bf16 weights
bit-identical between consecutive versions) and `preset_acceptance_gain` (acceptance gained over the run, a
fraction) come from a run of the trainer's low-change preset (online_rl.config.LOW_CHANGE) in the in-process
learning loop (benchmarks._change_vs_learning.preset_figures). `--preset-only` runs that part alone and merges its
keys into the recorded benchmarks/results/guard.json, the gate's keys as they were; `--preset-from-record` takes
them from the sweep's run of the preset's setting (records/change_vs_learning.json, the same run_setting) instead
of running it again. The preset's switch time (benchmarks._preset_switch: consecutive versions of the preset, and of
the learning benchmark's setting for comparison, published as signed deltas and switched to by the agent on one
SGLang replica, in place and by a reload side by side): `preset_switch_s_median`, `preset_reload_s_median`,
`preset_delta_mb_median` and the rest of `preset_switch_*`, `learning_setting_*` the comparison's; `--preset-switch`
runs that part alone and merges its keys into the recorded guard.json. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

SUITE = {"tasks": 16, "sessions": 4, "samples": 4}
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> dict:
    from benchmarks import _hacked_version
    from loadtests import versions
    from online_rl.gate.run import GateConfig, run_gate
    from online_rl.gate.suite import SuiteConfig
    from online_rl.model.bootstrap import bootstrap
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish
    from weight_sync.store.server import Store

    model = bootstrap("test", 0, progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    try:
        generate_key(tmp / "k.pem", tmp / "k.pub")
        pcfg = PublishConfig(store=tmp / "store", private_key=tmp / "k.pem")
        cfg = GateConfig(publish=pcfg, suite=SuiteConfig(**SUITE), work=tmp)
        publish(model, pcfg)
        candidates = {
            "equal": model,
            "degraded": versions.noisy(model, tmp / "degraded", seed=1, scale=0.3),
            "worse": versions.broken(model, tmp / "worse", seed=9),
        }
        runs = {}
        cache: dict = {}  # as `flywheel gate --follow` keeps it: v0's suite runs once, with the first candidate
        load_before = os.getloadavg()[0]
        for name, ckpt in candidates.items():
            v = publish(ckpt, pcfg, announce_now=False).version
            r = run_gate(cfg, v, baseline=0, cache=cache)
            runs[name] = {
                "version": v,
                "verdict": r.verdict,
                "reason": r.judgement.reason,
                "seconds": round(r.seconds, 1),
                "cpu_seconds": round(r.cpu_seconds, 1),
                "steps_s": r.record["figures"]["seconds"],
                "metrics": r.judgement.figures,
            }
        hacked = _hacked_version.run(model_dir=model)  # #51: a version trained on a hackable reward, monitored
        load_after = os.getloadavg()[0]
        store = Store(pcfg.store)
        later = [r["seconds"] for name, r in runs.items() if name != "equal"]  # the serving version's suite cached
        return {
            "model": "test preset (seed 0)",
            "suite": SUITE,
            "confidence": cfg.confidence,
            "margins": {m.name: m.margin for m in cfg.metrics()},
            "worse_version_blocked": runs["worse"]["verdict"] == "block"
            and store.gate_blocked() >= {runs["worse"]["version"]},
            "equal_version_passed": runs["equal"]["verdict"] == "pass",
            "degraded_version_verdict": runs["degraded"]["verdict"],
            "gate_seconds_per_version": round(statistics.median(later), 1),
            "gate_cpu_seconds_per_version": round(
                statistics.median(r["cpu_seconds"] for n, r in runs.items() if n != "equal"), 1
            ),
            "gate_seconds_first_version": runs["equal"]["seconds"],  # both versions' suites
            "load_average_1m": [round(load_before, 1), round(load_after, 1)],  # the machine's, before and after
            "blocked_unannounced": sorted(store.gate_blocked()),
            "runs": runs,
            **hacked,  # hacked_version_flagged, its verdict, the early-stop rates (benchmarks._hacked_version)
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(argv: list[str] | None = None) -> dict:
    from benchmarks import _change_vs_learning as change

    ap = argparse.ArgumentParser(prog="python -m benchmarks.guard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset-only", action="store_true", help="only the low-change preset's keys, into guard.json")
    ap.add_argument("--preset-from-record", action="store_true", help="--preset-only from the sweep's recorded run")
    ap.add_argument("--preset-budget", type=int, default=384, help="judged requests of the preset's run")
    ap.add_argument(
        "--hacked-only", action="store_true", help="only the reward-hacking monitors' run (#51), into guard.json"
    )
    ap.add_argument(
        "--preset-switch",
        action="store_true",
        help="only the preset's switch time (in place and reload), into guard.json",
    )
    ap.add_argument("--switch-versions", type=int, default=4, help="versions per setting of the switch measurement")
    ap.add_argument("--switch-model", default="demo", help="the model preset of the switch measurement")
    a = ap.parse_args(argv)
    if a.hacked_only:
        from benchmarks import _hacked_version

        return _merge(_hacked_version.run())
    if a.preset_switch:
        return _merge(_switch(a))
    if not (a.preset_only or a.preset_from_record):
        return {**main(), **change.preset_figures(a.preset_budget), **_switch(a)}
    if a.preset_from_record:
        sweep = json.loads((RESULTS / change.RECORD).read_text())
        runs = [r for r in sweep["runs"] if change.setting(r) == change.PRESET_SETTING]
        if not runs:
            raise SystemExit(f"{change.RECORD} has no run of the preset's setting {change.PRESET_SETTING}")
        preset = {**change.preset_keys(runs[0], sweep["budget_judged_requests"]), "preset_source": change.RECORD}
    else:
        preset = change.preset_figures(a.preset_budget)
    return _merge(preset)


def _switch(a: argparse.Namespace) -> dict:
    from benchmarks import _preset_switch

    return _preset_switch.figures(a.switch_versions, a.switch_model)


def _merge(keys: dict) -> dict:
    """guard.json as recorded, with one part's keys from a fresh run (the other parts' runs kept)."""
    path = RESULTS / "guard.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    out = {**recorded, **keys}
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
