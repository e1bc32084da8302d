"""MkDocs hook: the manual's figures, rendered from benchmarks/results/ when the site is built.

A page asks for a figure with a line of its own, `<!-- figure: NAME -->`; the hook replaces it with the table
FIGURES[NAME] renders from the JSON results the benchmarks (`make bench`, `python -m benchmarks NAME`) and the
recorded runs (benchmarks/results/records/) wrote. No figure in those tables is typed by hand: a new run's
JSON changes the page at the next build. An unknown name or a missing result fails the build.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- figure: ([a-z_]+) -->$", re.M)


def _load(rel: str) -> dict | list:
    return json.loads((RESULTS / rel).read_text())


def _round(x: float, dp: int) -> Decimal:
    """x to dp decimals, halves up (1.135 -> 1.14: the figure as written, not its binary neighbour)."""
    return Decimal(repr(x)).quantize(Decimal(1).scaleb(-dp), rounding=ROUND_HALF_UP)


def _sig(x: float, digits: int, max_dp: int = 6) -> str:
    """x to `digits` significant digits, at most max_dp decimals."""
    exp = Decimal(repr(x)).adjusted() if x else 0
    return str(_round(x, max(0, min(max_dp, digits - 1 - exp))))


def _ratio(x: float) -> str:
    return f"{_round(x, 2)}x"


def _pct(x: float) -> str:
    """A share as a percentage to one decimal, halves up; a whole 100% as such."""
    return "100%" if x == 1 else f"{(Decimal(repr(x)) * 100).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}%"


def _mean_59_459(curve: list) -> float:
    """The mean of a learning curve's evaluations from 59 to 459 judged requests (as the records' means)."""
    points = [acc for n, acc in curve if 59 <= n <= 459]
    return sum(points) / len(points)


# The table of every result (`make bench`).


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        elif not isinstance(v, list):
            rows.append((f"{prefix}{k}", v))
    return rows


def bench() -> str:
    """Every benchmark's result, one row per value (lists left out), benchmarks in name order."""
    lines = ["| benchmark | metric | value |", "|---|---|---|"]
    for f in sorted(RESULTS.glob("*.json")):
        for k, v in _flatten(json.loads(f.read_text())):
            if k != "benchmark":
                cell = str(v).replace("\n", "\\n").replace("|", "\\|")  # one table row per value
                cell = f"`{cell}`" if "<" in cell else cell  # a model's answer, not HTML
                lines.append(f"| {f.stem} | {k} | {cell} |")
    return "\n".join(lines)


# Figures of one benchmark or record each.


def demo() -> str:
    """The demo's table per version, as `flywheel demo` prints it (records/demo_summary.json)."""
    if str(ROOT) not in sys.path:  # mkdocs run from the checkout without PYTHONPATH
        sys.path.insert(0, str(ROOT))
    from flywheel.demo.report import table  # numpy: the project's environment

    rec = _load("records/demo_summary.json")
    rows = rec["rows"] if isinstance(rec, dict) else rec  # a demo_out/summary.json as it is, or a record of one
    return f"```\n{table(rows)}\n```"


def delta_kernels() -> str:
    """The delta codec's passes against a one-thread memcpy of the same bytes (kernels.json: medians of its runs,
    the scan's ratio in every run, the CPU and the machine's load average at the run's start and end)."""
    r = _load("kernels.json")
    rows = (  # label, the result's name of its pass
        ("scan (encoder: XOR byte planes, count, positions)", "scan"),
        ("dense scatter (decoder)", "scatter"),
        ("sparse scatter (decoder)", "sparse_scatter"),
        ("numpy's passes (XOR, planes, count)", "xor_split"),
    )
    lines = [
        "| pass | GB/s | vs memcpy |",
        "|---|---|---|",
        f"| memcpy (np.copyto, one thread) | {_round(r['memcpy_gbps'], 2)} | 1x |",
        *(f"| {label} | {_round(r[f'{k}_gbps'], 2)} | {_ratio(r[f'{k}_vs_memcpy'])} |" for label, k in rows),
        "",
        f"Medians of {r['delta_runs']} runs (the scan's ratio in each: "
        f"{', '.join(str(_round(x, 2)) for x in r['scan_vs_memcpy_runs'])}), compiled for `{r['cpu']}`, "
        f"the machine's load average {r['load_avg_1min'][0]} at the start and {r['load_avg_1min'][1]} at the end "
        f"(2 cores shared).",
    ]
    return "\n".join(lines)


def implicit_signals() -> str:
    """Precision and recall of each implicit signal against the simulated users' truth (implicit_signals.json)."""
    r = _load("implicit_signals.json")
    lines = ["| signal | named | precision | recall |", "|---|---|---|---|"]
    for name, s in r["signals"].items():
        lines.append(f"| `{name}` | {s['named']} | {s['precision']:.3f} | {s['recall']:.3f} |")
    reactions = ", ".join(f"{k} {v}" for k, v in sorted(r["user_reactions"].items()))
    lines += [
        "",
        f"{r['sessions']} sessions, {r['turns']} turns ({r['bad_turns']} bad); the users' reactions: {reactions}.",
    ]
    return "\n".join(lines)


def kafka_security() -> str:
    """Open, SCRAM and SCRAM over TLS brokers side by side (kafka_security.json); brackets: secured/open."""
    r = _load("kafka_security.json")
    lines = [
        "| broker | produce (acks=all, zstd) ev/s | one event sent alone, p50 | consume ev/s | client CPU per event |",
        "|---|---|---|---|---|",
    ]
    columns = (  # metric, decimals, unit
        ("produce_events_per_s", 0, ""),
        ("lone_send_p50_ms", 2, " ms"),
        ("consume_events_per_s", 0, ""),
        ("client_cpu_ms_per_event", 3, " ms"),
    )
    for key, label in (("open", "open"), ("scram", "SCRAM"), ("tls", "SCRAM + TLS 1.3")):
        cells = []
        for metric, dp, unit in columns:
            text = f"{_round(r[f'{key}_{metric}'], dp):,}{unit}"
            cells.append(text if key == "open" else f"{text} ({_ratio(r[f'{key}_over_open_{metric}'])})")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def long_context() -> str:
    """Time to first token cold and cached, and valid calls, by prompt length: the demo model
    (long_context.json) and the agent model (records/long_context_agent.json)."""
    demo_r, agent_r = _load("long_context.json"), _load("records/long_context_agent.json")
    lines = [
        "| prompt tokens | demo model: cold | cached | valid (greedy) | agent model: cold | cached | valid (greedy) |",
        "|---|---|---|---|---|---|---|",
    ]

    def cells(m: dict) -> str:
        valid = f"{m['outcomes_t1'].get('valid', 0)}/{sum(m['outcomes_t1'].values())}"
        return (
            f"{_sig(m['ttft_cold_s'], 3, 2)} s | {_sig(m['ttft_cached_s'], 2)} s "
            f"| {valid} ({'yes' if m['valid_greedy'] else 'no'})"
        )

    for length in sorted(demo_r["lengths"], key=int):
        d, a = demo_r["lengths"][length], agent_r["lengths"][length]
        label = f"~{int(length) // 1024}k ({d['prompt_tokens']:,} / {a['prompt_tokens']:,})"
        lines.append(f"| {label} | {cells(d)} | {cells(a)} |")
    return "\n".join(lines)


def inplace_switch() -> str:
    """The in-place switch against a reload from disk, at 2% and 30% of the elements changed: medians of the
    rounds, the first switch in brackets, the median of the rounds' side-by-side ratios and their range
    (records/delta_inplace_rounds.json: benchmarks/_delta_inplace.py run alone)."""
    r = _load("records/delta_inplace_rounds.json")
    lines = [
        "| changed | delta | in place | reload from disk | ratio: median of rounds (range) | same answers |",
        "|---|---|---|---|---|---|",
    ]
    for key in sorted((k.rsplit("_", 1)[1] for k in r if k.startswith("inplace_switch_s_")), key=lambda k: int(k[:-3])):
        rep = r[f"inplace_report_{key}"]
        if rep["patch_full_elems"] > rep["patch_sparse_elems"]:  # whole tensors sent: the patch is most of it
            first = f"{_round(r[f'inplace_switch_first_s_{key}'], 2)} s, whole tensors"
        else:
            first = (
                f"{_round(r[f'inplace_switch_first_s_{key}'], 2)} s: patch {_round(rep['patch_ms'] / 1000, 2)} s, "
                f"engine {_round(rep['load_ms'] / 1000, 2)} s"
            )
        reload_first = _round(r[f"reload_report_{key}"]["serving_ms"] / 1000, 2)
        runs = r[f"inplace_vs_reload_runs_{key}"]
        lines.append(
            f"| {key[:-3]}% | {_sig(r[f'inplace_delta_mb_{key}'], 3, 1)} MB "
            f"| {_round(r[f'inplace_switch_s_{key}'], 2)} s ({first}) "
            f"| {_round(r[f'reload_switch_s_{key}'], 2)} s ({reload_first} s) "
            f"| {_round(r[f'inplace_vs_reload_{key}_median'], 2)} ({_round(min(runs), 2)}-{_round(max(runs), 2)}) "
            f"| {'yes' if r[f'inplace_same_answers_{key}'] else 'no'} |"
        )
    return "\n".join(lines)


def relay() -> str:
    """Store egress and time until every agent has a version, with the peer relays and without (delta.json's
    relay rounds: real replicas, and the synthetic 50 Mbit/s fleet), then the synthetic chain and star."""
    r = _load("delta.json")
    lines = [
        "| agents | store egress, relays / none | time until all have it, relays / none |",
        "|---|---|---|",
    ]

    def pair(relays: str, direct: str, fmt: Callable[[float], str]) -> str:
        return fmt(r[relays]) + (f" / {fmt(r[direct])}" if direct in r else "")

    for n in sorted(int(k.rsplit("_", 1)[1]) for k in r if k.startswith("synthetic_fleet_materialize_s_")):
        egress = pair(
            f"synthetic_store_egress_ratio_{n}", f"synthetic_direct_store_egress_ratio_{n}", lambda x: str(_round(x, 1))
        )
        if f"store_egress_ratio_{n}" in r:  # the replicas' rounds, shown apart only where they disagree
            replicas = pair(f"store_egress_ratio_{n}", f"direct_store_egress_ratio_{n}", lambda x: str(_round(x, 1)))
            egress = egress if egress.startswith(replicas) else f"replicas {replicas}; synthetic {egress}"
        times = []
        if f"fleet_switch_s_{n}" in r:
            times.append(
                "replicas " + pair(f"fleet_switch_s_{n}", f"direct_fleet_switch_s_{n}", lambda x: f"{_round(x, 2)} s")
            )
        times.append(
            "synthetic "
            + pair(
                f"synthetic_fleet_materialize_s_{n}",
                f"synthetic_direct_fleet_materialize_s_{n}",
                lambda x: f"{_round(x, 1)} s",
            )
        )
        lines.append(f"| {n} | {egress} | {'; '.join(times)} |")
    for shape, fanout in (("a chain", 1), ("a star", 5)):
        for k in sorted(k for k in r if k.startswith(f"synthetic_fanout{fanout}_fleet_materialize_s_")):
            n = k.rsplit("_", 1)[1]
            lines.append(
                f"| {n}, {shape} (`--relay-fanout {fanout}`) "
                f"| {_round(r[f'synthetic_fanout{fanout}_store_egress_ratio_{n}'], 1)} "
                f"| synthetic {_round(r[k], 1)} s |"
            )
    return "\n".join(lines)


def feedback_modes() -> str:
    """The live demo per feedback mode, one run each (records/demo_feedback_modes.json; the demo model of 2026-12-02
    under previous_demo_model): the kept share of the first and last version, the first version kept by 90% of the
    judged (and the one before it when it missed by less than a point), the judged requests before it, the
    trainer's updates by the last version, the signals."""
    r = _load("records/demo_feedback_modes.json")
    runs = [(f"`{m}`", r[m]) for m in ("basic", "persist", "text")]
    before = r["previous_demo_model"]
    runs += [
        (f"`{mode}`, previous demo model{extra}", before[key])
        for key, mode, extra in (
            ("basic", "basic", ""),
            ("persist", "persist", ""),
            ("text", "text", ""),
            ("text_unbounded", "text", ", sampling unbounded (before `--distill-contexts`)"),
        )
    ]
    lines = [
        "| live demo | kept share v0 -> v6 | first version kept >= 90% | judged requests before it "
        "| updates by v6 | comments / persisted checks sent |",
        "|---|---|---|---|---|---|",
    ]
    for label, run in runs:
        versions, verdict = run["versions"], run["verdict"]
        reached = next((i for i, v in enumerate(versions) if v["kept"] >= 0.9), None)
        if reached is None:
            best = max(versions, key=lambda v: v["kept"])
            first = f"none (best v{best['version']} {_pct(best['kept'])})"
        else:
            first = f"v{versions[reached]['version']} ({_pct(versions[reached]['kept'])}"
            if reached and versions[reached - 1]["kept"] >= 0.89:
                first += f"; v{versions[reached - 1]['version']} {_pct(versions[reached - 1]['kept'])}"
            first += ")"
        sent = verdict["signals_sent"]
        lines.append(
            f"| {label} | {_pct(versions[0]['kept'])} -> {_pct(versions[-1]['kept'])} | {first} "
            f"| {verdict['requests_to_90'] or '-'} | {run['updates_by_v6']} | {sent['comment']} / {sent['persisted']} |"
        )
    return "\n".join(lines)


def learning() -> str:
    """Judged requests until the evaluation reaches 90%, per feedback variant against accept/reject, when the
    users' own kept share first does, and the final evaluation (learning.json)."""
    r = _load("learning.json")
    lines = [
        "| learning from | judged requests to 90% (evaluation) | users' own kept share over 128 reaches 90% at "
        "| final evaluation |",
        "|---|---|---|---|",
    ]
    labels = {
        "base": "accept/reject (`basic`)",
        "persist": "+ persistence (`persist`)",
        "text": "+ text feedback (`text`)",
    }
    for key, label in labels.items():
        v = r["variants"][key]
        requests = str(r[f"requests_to_90_{key}"] or f"not in {r['budget_judged_requests']}")
        if key != "base":
            requests += f" ({_vs_base(r, key)})"
        users = next(
            (str(n) for n, kept in v["users_kept_curve"] if kept >= r["target"]),
            f"not in {r['budget_judged_requests']}",
        )
        lines.append(f"| {label} | {requests} | {users} | {_round(r[f'final_acceptance_{key}'], 3)} |")
    return "\n".join(lines)


def learning_pools() -> str:
    """Judged requests to 90% per variant, by task pool and seed, on the demo model with multi-line families:
    learning.json (seed 0), records/learning_seed1.json, records/learning_multiline.json (multi-line tasks only)."""
    lines = [
        "| pool | seed | budget | eval every | accept/reject | + persistence | + text | text / accept-reject |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("learning.json", "records/learning_seed1.json", "records/learning_multiline.json"):
        r = _load(name)
        cells = [str(r.get(f"requests_to_90_{v}") or f"not in {r['budget_judged_requests']}") for v in VARIANT_KEYS]
        lines.append(
            f"| {r['families']} ({r['pool_tasks']} tasks) | {r['seed']} | {r['budget_judged_requests']} "
            f"| {r['eval_every_rounds']} rounds | {' | '.join(cells)} | {_vs_base(r, 'text')} |"
        )
    return "\n".join(lines)


VARIANT_KEYS = ("base", "persist", "text")


def _vs_base(r: dict, variant: str) -> str:
    """A variant's requests to 90% against accept/reject's: a ratio, or a bound where accept/reject never got
    there within the budget (benchmarks.learning.ratios)."""
    if f"{variant}_vs_base_requests_ratio" in r:
        return _ratio(r[f"{variant}_vs_base_requests_ratio"])
    if f"{variant}_vs_base_requests_ratio_below" in r:
        return f"< {_ratio(r[f'{variant}_vs_base_requests_ratio_below'])}"
    return "-"


def _requests_mean(requests: int | None, mean: float, budget: int = 460) -> str:
    return f"{requests if requests is not None else f'not in {budget}'} / {_round(mean, 3)}"


def learning_passes() -> str:
    """Requests to 90% / mean evaluation 59-459 by passes per update (seed 0; the demo model before the multi-line
    families): base from records/learning_previous_demo_model.json (two passes)
    and records/learning_one_pass.json (one), the rest from records/learning_epochs_and_distill_step.json, and
    one pass's persist and text (0.03) from records/learning_distill_coef_sweep.json."""
    runs = _load("records/learning_epochs_and_distill_step.json")["landed_code_runs"]["runs"]
    sweep = _load("records/learning_distill_coef_sweep.json")["runs"]
    one_pass, two_pass = _load("records/learning_one_pass.json"), _load("records/learning_previous_demo_model.json")
    cells: dict[tuple[int, str], str] = {}
    for epochs, r in ((1, one_pass), (2, two_pass)):  # 768 requests; the mean over the same 59-459 evaluations
        base = r["variants"]["base"]
        cells[epochs, "base"] = _requests_mean(base["requests_to_target"], _mean_59_459(base["curve"]))
    for s in sweep:
        if s["seed"] == 0 and (s["variant"], s["distill_coef"]) in (("persist", None), ("text", 0.03)):
            cells[1, s["variant"]] = _requests_mean(s["requests_to_90"], s["mean_evaluation_59_to_459"])
    for x in runs:
        if x["seed"] != 0:
            continue
        column = "text_step" if x["distill_step"] else x["variant"]
        if column != "text" or x["distill_coef"] == 0.03:
            cells.setdefault((x["epochs"], column), _requests_mean(x["requests_to_90"], x["mean_evaluation_59_459"]))
    lines = [
        "| passes | base | persist | text (gamma 0.03) "
        "| text, distillation in its own step (`--distill-step`, gamma 1.0) |",
        "|---|---|---|---|---|",
    ]
    for epochs in sorted({e for e, _ in cells}):
        row = [cells.get((epochs, c), "") for c in ("base", "persist", "text", "text_step")]
        lines.append(f"| {epochs} | {' | '.join(row)} |".replace("|  |", "| |"))
    return "\n".join(lines)


def distill_coef() -> str:
    """Mean evaluation 59-459 / requests to 90% of text feedback by distillation coefficient, and of persist, on
    two seeds (records/learning_distill_coef_sweep.json; the plain estimator's runs)."""
    runs = [s for s in _load("records/learning_distill_coef_sweep.json")["runs"] if s["variant"] in ("text", "persist")]
    coefs = sorted({s["distill_coef"] for s in runs if s["variant"] == "text"})
    columns = [("text", c) for c in coefs] + [("persist", None)]
    lines = [
        "| gamma | "
        + " | ".join("persist" if v == "persist" else ("0" if c == 0 else str(c)) for v, c in columns)
        + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    labels = {0: "seed 0: mean evaluation / requests to 90%", 1: "seed 1 (`--seed 1 --model-seed 0`)"}
    for seed in sorted({s["seed"] for s in runs}):
        by = {(s["variant"], s["distill_coef"]): s for s in runs if s["seed"] == seed}
        row = []
        for col in columns:
            s = by.get(col)
            row.append(
                ""
                if s is None
                else f"{_round(s['mean_evaluation_59_to_459'], 3)} / "
                + (str(s["requests_to_90"]) if s["requests_to_90"] is not None else "not in 460")
            )
        lines.append(f"| {labels.get(seed, f'seed {seed}')} | {' | '.join(row)} |".replace("|  |", "| |"))
    return "\n".join(lines)


def scrub() -> str:
    """The secret scanner alone on one core, with its first pass and every line through every plugin: distinct
    IDE-shaped events (nothing cached) and the labelled corpus (records/gateway_scrub_only.json)."""
    r = _load("records/gateway_scrub_only.json")
    lines = [
        "| scan | distinct events/s per core (~2.5 KB, 3 texts) | corpus recall | corpus false positives |",
        "|---|---|---|---|",
    ]
    paths = (("Hyperscan first pass, then detect-secrets", ""), ("every line through every plugin", "_every_line"))
    for label, key in paths:
        lines.append(
            f"| {label} | {_round(r['scrub_distinct_events_per_s' + key], 0):,} | {_pct(r['scrub_recall' + key])} "
            f"| {_pct(r['scrub_false_positive_share' + key])} |"
        )
    return "\n".join(lines)


def mined_features() -> str:
    """Feature mode's short run (tasks_feature.json, `python -m benchmarks.tasks --mode feature` with small caps):
    per source, candidates verified, valid tasks, rejections by reason, sandbox seconds per task."""
    r = _load("tasks_feature.json")
    lines = [
        "| source | features with a test file | verified (the cap) | valid | rejected or passed over (by reason) "
        "| sandbox s / task |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in r["sources"].items():
        reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(s["rejected"].items(), key=lambda kv: -kv[1]))
        per = "-" if s["sandbox_s_per_task"] is None else _sig(s["sandbox_s_per_task"], 3)
        counts = f"{s['found']:,} | {s['candidates']} | {s['valid']}"
        lines.append(f"| {name} {s['version']} | {counts} | {reasons} | {per} |")
    return "\n".join(lines)


def guard() -> str:
    """The eval gate on three candidates against the served test model (guard.json): verdict, each metric
    candidate vs baseline (a regressed one in bold), and what the gate cost."""
    r = _load("guard.json")
    names = {
        "pass_at_1": "pass@1",
        "session_success": "session success",
        "valid_tool_call_rate": "valid tool calls",
        "empty_or_refusal": "empty or refused",
        "answer_tokens": "answer tokens",
    }
    lines = [
        "| candidate | verdict | " + " | ".join(names.values()) + " | gate s | CPU s |",
        "|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for name, run in r["runs"].items():
        cells = []
        for key in names:
            f = run["metrics"][key]
            cell = f"{_sig(f['candidate'], 3)} vs {_sig(f['baseline'], 3)}"
            cells.append(f"**{cell}**" if f["regressed"] else cell)
        lines.append(
            f"| {name} | {run['verdict']} | {' | '.join(cells)} | {_round(run['seconds'], 0)} | "
            f"{_round(run['cpu_seconds'], 0)} |"
        )
    s = r["suite"]
    lines.append("")
    lines.append(
        f"Suite: {s['tasks']} held-out tasks and {s['sessions']} agent sessions, {s['samples']} samples each; "
        f"{r['confidence']:.0%} one-sided bounds. Worse version blocked: {r['worse_version_blocked']}; equal version "
        f"passed: {r['equal_version_passed']}. One more version costs {r['gate_seconds_per_version']} s "
        f"({r['gate_cpu_seconds_per_version']} CPU s; the median after the first, whose gate also ran the served "
        f"version's suite: {r['gate_seconds_first_version']} s) on 2 cores shared with other work (load "
        f"{r['load_average_1m'][0]} before, {r['load_average_1m'][1]} after)."
    )
    return "\n".join(lines)


def demo_gate() -> str:
    """The eval gate in the demo, test-preset runs side by side (records/demo_gate.json): per version the gate's
    verdict, wall and CPU seconds (from its signed record) and what users then saw; per run the demo's verdict."""
    r = _load("records/demo_gate.json")
    lines = [
        "| run | version | gate | gate s | gate CPU s | acceptance | judged | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ends = []
    for run in r["runs"]:
        for row in run["rows"]:
            acc = "-" if row["acceptance"] is None else _pct(row["acceptance"])
            gate_s = "-" if row["gate_s"] is None else str(_round(row["gate_s"], 1))
            cpu_s = "-" if row["gate_cpu_s"] is None else str(_round(row["gate_cpu_s"], 1))
            lines.append(
                f"| {run['name']} | v{row['version']} | {row['gate'] or '-'} | {gate_s} | {cpu_s} | {acc} | "
                f"{row['judged']} | {'-' if row['p99_ms'] is None else _round(row['p99_ms'], 0)} |"
            )
        v, g = run["verdict"], run.get("gate")
        end = (
            f"{run['name']}: acceptance v0 {_pct(v['base_acceptance'])} -> v{v['final_version']} "
            f"{_pct(v['final_acceptance'])} ({v['rise_points']:+} points, goal +{v['goal_points']:.0f}), "
            f"{v['failed_requests']} failed requests: {'goal met' if v['goal_met'] else 'goal missed'}"
        )
        if g:
            end += (
                f"; gate median {g['seconds_median']} s (max {g['seconds_max']} s) and {g['cpu_seconds_median']} "
                f"CPU s per version against the {g['publish_interval_s']:.0f} s publish interval, waiting at the "
                f"end: {', '.join(f'v{x}' for x in g['waiting_at_end']) or 'none'}"
            )
        ends.append(end + f" (load average {run['load_average_1m'][0]} before, {run['load_average_1m'][1]} after).")
    alone = r["suite_alone"]
    ends.append(
        "one suite alone, one torch thread, not niced: "
        + ", ".join(f"{p} preset {alone[p]['wall_s']} s ({alone[p]['cpu_s']} CPU s)" for p in ("test", "demo"))
        + f" (load average {alone['test']['load']:.1f})."
    )
    return "\n".join(lines + [""] + ["- " + e for e in ends])


def change_vs_learning() -> str:
    """Per-version change against learning speed by learning rate and steps per version
    (records/change_vs_learning.json), and the low-change preset's run in guard.json."""
    rec, g = _load("records/change_vs_learning.json"), _load("guard.json")
    lines = [
        "| lr | requests / version | optimizer steps / version | versions | bf16 identical per version: mean (min) "
        "| delta ratio (median) | acceptance at start | gained (last two evaluations) | judged requests to +5 points |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rec["runs"]:
        lines.append(
            f"| {r['lr']:g} | {r['requests_per_round'] * r['rounds_per_version']} | "
            f"{r['optimizer_steps_per_version']:g} | {r['versions']} | "
            f"{_pct(r['identical_share_mean'])} ({_pct(r['identical_share_min'])}) | {r['delta_ratio_median']:.1f}x | "
            f"{_pct(r['acceptance_start'])} | {100 * r['acceptance_gain']:+.1f} points | "
            f"{r['requests_to_gain_5pts'] if r['requests_to_gain_5pts'] is not None else 'not within the budget'} |"
        )
    p = g["preset"]
    lines.append("")
    lines.append(
        f"The preset in guard.json (lr {p['lr']:g}, {p['epochs']} optimizer step a version of "
        f"{p['requests_per_version']} requests, {p['budget']} judged requests; "
        f"{'the sweep' + chr(39) + 's run of its setting' if g.get('preset_source') else 'its own run'}): "
        f"{_pct(g['preset_identical_share'])} of bf16 weights bit-identical "
        f"per version on average (the least {_pct(g['preset_identical_share_min'])}), delta ratio "
        f"{g['preset_delta_ratio_median']:.1f}x, acceptance gained {100 * g['preset_acceptance_gain']:+.1f} points."
    )
    return "\n".join(lines)


def preset_switch() -> str:
    """The low-change preset's versions switched to on one replica, in place and by a reload, against the learning
    benchmark's setting (guard.json's preset_switch keys: benchmarks._preset_switch)."""
    g = _load("guard.json")
    lines = [
        "| setting | versions | bf16 identical per version (mean) | delta in the store (median) | delta ratio "
        "(median) | in-place switch (median; each version) | reload (median; each version) | in place / reload "
        "(median) | answers as a reload |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for prefix, name in (("preset", "low-change preset"), ("learning_setting", "learning benchmark's")):
        s = g["preset_switch_settings"][prefix]
        runs = g[f"{prefix}_switch_versions"]
        lr = f"{s['lr']:.0e}".replace("e-0", "e-")  # 1e-5, as the manual writes it
        lines.append(
            f"| {name}: lr {lr}, {s['epochs']} optimizer step{'s' * (s['epochs'] > 1)} a version of "
            f"{s['requests_per_round'] * s['rounds_per_version']} requests | {len(runs)} | "
            f"{_pct(g[f'{prefix}_switch_identical_share'])} | {_sig(g[f'{prefix}_delta_mb_median'] * 1024, 3)} KiB | "
            f"{g[f'{prefix}_switch_delta_ratio_median']:.1f}x | "
            f"{g[f'{prefix}_switch_s_median']:.2f} s ({', '.join(f'{t:.2f}' for t in g[f'{prefix}_switch_runs_s'])}) | "
            f"{g[f'{prefix}_reload_s_median']:.2f} s ({', '.join(f'{t:.2f}' for t in g[f'{prefix}_reload_runs_s'])}) | "
            f"{_ratio(g[f'{prefix}_switch_vs_reload_median'])} | "
            f"{'yes, every version' if g[f'{prefix}_switch_same_answers'] else 'NO'} |"
        )

    def whole(prefix: str) -> str:
        rows = g[f"{prefix}_switch_versions"]
        return f"{', '.join(str(r['tensors_whole']) for r in rows)} of {rows[0]['tensors']}"

    lines.append("")
    lines.append(
        f"{g['preset_switch_model']}; the machine's load average {g['preset_switch_load_avg_1min'][0]} when the "
        f"switches began and {g['preset_switch_load_avg_1min'][1]} when they ended. Tensors over 5% changed, sent "
        f"whole in the in-place patch, each version: the preset's {whole('preset')}, the learning benchmark's "
        f"setting's {whole('learning_setting')}."
    )
    return "\n".join(lines)


def prometheus_crosscheck() -> str:
    """The demo's per-version table against PromQL, and the alerts seen, as the demo prints them
    (records/demo_prometheus_crosscheck.json)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from flywheel.observe.command import crosscheck_table

    r = _load("records/demo_prometheus_crosscheck.json")
    alerts = ", ".join(f"{a['alert']} ({a['state']})" for a in r["alerts_seen"]) or "none"
    return f"```\n{crosscheck_table(r['prometheus_crosscheck'])}\nalerts during the run: {alerts}\n```"


FIGURES: dict[str, Callable[[], str]] = {
    "bench": bench,
    "change_vs_learning": change_vs_learning,
    "delta_kernels": delta_kernels,
    "demo": demo,
    "demo_gate": demo_gate,
    "distill_coef": distill_coef,
    "feedback_modes": feedback_modes,
    "guard": guard,
    "implicit_signals": implicit_signals,
    "inplace_switch": inplace_switch,
    "kafka_security": kafka_security,
    "learning": learning,
    "learning_pools": learning_pools,
    "learning_passes": learning_passes,
    "long_context": long_context,
    "mined_features": mined_features,
    "preset_switch": preset_switch,
    "prometheus_crosscheck": prometheus_crosscheck,
    "relay": relay,
    "scrub": scrub,
}


def render(markdown: str) -> str:
    """The page with each `<!-- figure: NAME -->` line replaced by its figure."""

    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in FIGURES:
            raise ValueError(f"unknown figure {name!r} (docs/hooks/figures.py knows {sorted(FIGURES)})")
        return FIGURES[name]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown, page, config, files):
    return render(markdown)


def on_serve(server, config, builder):
    server.watch(str(RESULTS))  # `mkdocs serve`: a new result rebuilds the pages
    return server
