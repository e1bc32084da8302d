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
    """The in-place switch against a reload from disk, at 2% and 30% of the elements changed: medians, the first
    switch in brackets (records/delta_inplace_alone.json: benchmarks/_delta_inplace.py run alone)."""
    r = _load("records/delta_inplace_alone.json")
    lines = [
        "| changed | delta | in place | reload from disk | ratio | same answers |",
        "|---|---|---|---|---|---|",
    ]
    for key in sorted((k.rsplit("_", 1)[1] for k in r if k.startswith("inplace_switch_s_")), key=lambda k: int(k[:-3])):
        rep = r[f"inplace_report_{key}"]
        if rep["patch_full_elems"]:  # whole tensors sent: the patch is most of it
            first = f"{_round(r[f'inplace_switch_first_s_{key}'], 2)} s, whole tensors"
        else:
            first = (
                f"{_round(r[f'inplace_switch_first_s_{key}'], 2)} s: patch {_round(rep['patch_ms'] / 1000, 2)} s, "
                f"engine {_round(rep['load_ms'] / 1000, 2)} s"
            )
        reload_first = _round(r[f"reload_report_{key}"]["serving_ms"] / 1000, 2)
        lines.append(
            f"| {key[:-3]}% | {_sig(r[f'inplace_delta_mb_{key}'], 3, 1)} MB "
            f"| {_round(r[f'inplace_switch_s_{key}'], 2)} s ({first}) "
            f"| {_round(r[f'reload_switch_s_{key}'], 2)} s ({reload_first} s) "
            f"| {_round(r[f'inplace_vs_reload_{key}'], 2)} ({_round(r[f'inplace_vs_reload_first_{key}'], 2)}) "
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
        replicas_egress = pair(f"store_egress_ratio_{n}", f"direct_store_egress_ratio_{n}", lambda x: str(_round(x, 1)))
        if f"store_egress_ratio_{n}" in r and not egress.startswith(replicas_egress):  # the two kinds disagree
            egress = f"replicas {replicas_egress}; synthetic {egress}"
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


FIGURES: dict[str, Callable[[], str]] = {
    "bench": bench,
    "demo": demo,
    "implicit_signals": implicit_signals,
    "inplace_switch": inplace_switch,
    "kafka_security": kafka_security,
    "long_context": long_context,
    "relay": relay,
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
