"""The demo's per-version summary: what users saw of each weight version, and what each switch cost.

From the population's interactions (outcome, latency, serving version), the agents' switch reports and the
store's manifests: one row per version with acceptance (accepted / judged; ignored completions are not
judged) of the autocomplete users and of the agent users' sessions (a session counts for the version of its
first turn; accepted: the file it left passes its hidden tests), the agent's turns by the implicit signals
the gateway read from its sessions (it sends no feedback: serving.signals.implicit), requests, failed requests
(counted against the version the fleet served when they failed), p50/p99 latency of the autocomplete requests, the
user-visible switch pause (max over replicas), time out of rotation, the delta's size and compression ratio, and
the share of its bf16 weights bit-identical to its base version (from the manifest's chunks; none for a full
snapshot), and, with the eval gate on, the gate's verdict on it and what judging it cost (wall and CPU seconds, from
its signed gate record: flywheel.demo.gate). A version the gate blocked has a row too, with no requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FIELDS = (
    "version",
    "acceptance",
    "kept",
    "judged",
    "agent_acceptance",
    "sessions",
    "implicit_acceptance",
    "implicit_signals",
    "requests",
    "failed",
    "p50_ms",
    "p99_ms",
    "switch_pause_ms",
    "out_of_rotation_ms",
    "delta_mb",
    "delta_ratio",
    "identical_share",
    "gate",
    "gate_s",
    "gate_cpu_s",
)


def summarize(
    records: list,
    switches: list[dict],
    manifests: dict[int, Any],
    signals: Sequence[tuple[str, str]] = (),
    gates: dict[int, dict] | None = None,
) -> list[dict]:
    """records: flywheel.demo.population.Interaction; switches: agents' switches.jsonl rows; manifests by version;
    signals: (signal, completion id) of the implicit feedback the gateway read from agent sessions; gates: the eval
    gate's verdicts by version (flywheel.demo.gate.verdicts)."""
    gates = gates or {}
    turn_version = {
        cid.removeprefix("msg_"): v for r in records for cid, v in (getattr(r, "turn_versions", None) or {}).items()
    }
    implicit: dict[int, list[int]] = {}  # version -> [positive, negative]
    for name, cid in signals:
        v = turn_version.get(cid.removeprefix("msg_"))
        if v is not None:
            implicit.setdefault(v, [0, 0])[0 if name == "tests_pass" else 1] += 1
    first_served: dict[int, float] = {}
    for r in records:
        if r.version is not None:
            v = r.version
            first_served[v] = min(first_served.get(v, r.started), r.started)
    versions = sorted(set(first_served) | {int(s["version"]) for s in switches} | set(gates))
    rows = []
    for v in versions:
        mine = [r for r in records if r.version == v]
        later = [first_served[u] for u in first_served if u > v]
        until = min(later) if later else float("inf")
        since = -float("inf") if v == versions[0] else first_served.get(v, float("inf"))  # the first: all before it
        failed = [r for r in records if r.outcome == "failed" and since <= r.started < until]
        judged = [r for r in mine if r.outcome in ("accept", "reject") and _kind(r) == "autocomplete"]
        sessions = [r for r in mine if r.outcome in ("accept", "reject") and _kind(r) == "agent"]
        # Request latency: an agent record's is its whole session (several turns), not one request's.
        lat = np.array([r.latency_s for r in mine if _kind(r) == "autocomplete"]) * 1000
        sw = [s for s in switches if int(s["version"]) == v]
        m = manifests.get(v)
        rows.append(
            {
                "version": v,
                "acceptance": _rate(judged),
                "kept": _kept(judged),
                "judged": len(judged),
                "agent_acceptance": _rate(sessions),
                "sessions": len(sessions),
                # the agent's turns by what the gateway read from its sessions: tests passing after an edit
                # against every negative verdict (tests failing, correction, repeat, revert, abandoned)
                "implicit_acceptance": round(implicit[v][0] / sum(implicit[v]), 4)
                if sum(implicit.get(v, []))
                else None,
                "implicit_signals": sum(implicit.get(v, [])),
                "requests": len(mine),
                "failed": len(failed),
                "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat.size else None,
                "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat.size else None,
                "switch_pause_ms": max((s.get("pause_ms", 0.0) for s in sw), default=None),
                "out_of_rotation_ms": max((s.get("drain_ms", 0.0) + s.get("load_ms", 0.0) for s in sw), default=None),
                "delta_mb": round(m.nbytes_compressed / 2**20, 3) if m is not None else None,
                "delta_ratio": round(m.nbytes_raw / max(1, m.nbytes_compressed), 1) if m is not None else None,
                "identical_share": identical_share(m),
                "kind": getattr(m, "kind", None),
                "gate": gates.get(v, {}).get("verdict"),
                "gate_s": gates.get(v, {}).get("seconds"),
                "gate_cpu_s": gates.get(v, {}).get("cpu_seconds"),
            }
        )
    return rows


def identical_share(manifest) -> float | None:
    """The share of a delta version's elements whose bits equal its base version's (each chunk counts what
    changed); None for a full snapshot or no manifest."""
    if manifest is None or manifest.kind != "delta":
        return None
    total = sum(c.elems for t in manifest.tensors for c in t.chunks)
    changed = sum(c.changed for t in manifest.tensors for c in t.chunks)
    return round(1.0 - changed / max(1, total), 4)


def _kind(r) -> str:
    return getattr(r, "kind", "autocomplete")


def _rate(judged: list) -> float | None:
    return round(sum(r.outcome == "accept" for r in judged) / len(judged), 4) if judged else None


def _kept(judged: list) -> float | None:
    """The share accepted and kept: accepted and passing its hidden tests (a fooled accept is deleted later)."""
    known = [r for r in judged if getattr(r, "passed", None) is not None]
    return round(sum(r.outcome == "accept" and r.passed for r in known) / len(known), 4) if known else None


def table(rows: list[dict]) -> str:
    head = (
        f"{'version':>7} {'accept':>7} {'kept':>7} {'judged':>6} {'agent':>7} {'sess':>5} {'implicit':>8} {'sig':>4} "
        f"{'reqs':>5} {'failed':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'pause ms':>8} {'out ms':>7} {'delta MB':>8} {'ratio':>6} {'same':>6}"
    )
    gated = any(r.get("gate") for r in rows)  # the gate's columns only when it ran
    head += f" {'gate':>8} {'gate s':>6} {'cpu s':>6}" if gated else ""
    lines = [head, "-" * len(head)]

    def f(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))

    for r in rows:
        lines.append(
            f"{'v' + str(r['version']):>7} {f(r['acceptance'] and 100 * r['acceptance'], '6.1f')}% "
            f"{f(r.get('kept') and 100 * r['kept'], '6.1f')}% {r['judged']:>6} "
            f"{f(r['agent_acceptance'] and 100 * r['agent_acceptance'], '6.1f')}% "
            f"{r['sessions']:>5} {f(r.get('implicit_acceptance') and 100 * r['implicit_acceptance'], '7.1f')}% "
            f"{r.get('implicit_signals', 0):>4} {r['requests']:>5} {r['failed']:>6} {f(r['p50_ms'], '7.0f')} "
            f"{f(r['p99_ms'], '7.0f')} {f(r['switch_pause_ms'], '8.0f')} {f(r['out_of_rotation_ms'], '7.0f')} "
            f"{f(r['delta_mb'], '8.3f')} {f(r['delta_ratio'], '6.1f')} "
            f"{f(r.get('identical_share') and 100 * r['identical_share'], '5.1f')}%"
            + (_gate_cells(r, f) if gated else "")
        )
    return "\n".join(lines)


def _gate_cells(r: dict, f) -> str:
    return f" {r.get('gate') or '-':>8} {f(r.get('gate_s'), '6.1f')} {f(r.get('gate_cpu_s'), '6.1f')}"


def verdict(rows: list[dict], min_judged: int = 30, goal_points: float = 20.0) -> dict:
    """Did acceptance rise `goal_points` from the base version, with every switch hot?"""
    usable = [r for r in rows if r["judged"] >= min_judged and r["acceptance"] is not None]
    base = next((r for r in usable if r["version"] == 0), None)
    last = usable[-1] if usable else None
    rise = None if base is None or last is None else round(100 * (last["acceptance"] - base["acceptance"]), 1)
    failed = sum(r["failed"] for r in rows)
    # Judged requests served before the first version whose kept share reached 90% (None: none did).
    to90, served = None, 0
    for r in usable:
        if r.get("kept") is not None and r["kept"] >= 0.9:
            to90 = served
            break
        served += r["judged"]
    return {
        "requests_to_90": to90,
        "base_version": 0,
        "base_acceptance": base and base["acceptance"],
        "final_version": last and last["version"],
        "final_acceptance": last and last["acceptance"],
        "rise_points": rise,
        "failed_requests": failed,
        "goal_points": goal_points,
        "goal_met": rise is not None and rise >= goal_points and failed == 0,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["acceptance"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["version"] for r in rows]
    ys = [100 * r["acceptance"] for r in rows]
    ax.plot(xs, ys, marker="o", label="autocomplete: completions accepted")
    for r, y in zip(rows, ys):
        ax.annotate(
            f"n={r['judged']}", (r["version"], y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7
        )
    ax.set_xlabel("weight version (hot-switched)")
    ax.set_ylabel("acceptance (%)")
    implicit = [r for r in rows if r.get("implicit_acceptance") is not None]
    if implicit:
        ax.plot(
            [r["version"] for r in implicit],
            [100 * r["implicit_acceptance"] for r in implicit],
            marker="^",
            linestyle="--",
            label="agent: implicit signals positive (no feedback sent)",
        )
    agents = [r for r in rows if r.get("agent_acceptance") is not None]
    if agents or implicit:
        ax.plot(
            [r["version"] for r in agents],
            [100 * r["agent_acceptance"] for r in agents],
            marker="s",
            label="agent: sessions whose file passes",
        )
        ax.legend(fontsize=8)
    ax.set_title("Simulated IDE users: acceptance per version")
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(rows: list[dict], verdict_: dict, out_dir: Path) -> None:
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "verdict.json").write_text(json.dumps(verdict_, indent=1))
    plot(rows, out_dir / "acceptance.png")
