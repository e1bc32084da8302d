"""Latency and throughput over a load test, with the scenario's actions marked."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np


def plot(out_dir: Path, title: str, bin_s: float = 2.0) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    path = out_dir / "requests.csv"
    if not path.exists():
        return None
    rows = list(csv.DictReader(path.open()))
    if not rows:
        return None
    starts = np.array([float(r["start"]) for r in rows])
    ms = np.array([float(r["ms"]) for r in rows])
    ok = np.array([r["ok"] == "1" for r in rows])
    t0 = starts.min()
    rel = starts - t0
    edges = np.arange(0, rel.max() + bin_s, bin_s)
    mid, p50, p99, rate, fails = [], [], [], [], []
    for lo in edges:
        sel = (rel >= lo) & (rel < lo + bin_s)
        mid.append(lo + bin_s / 2)
        good = ms[sel & ok]
        p50.append(np.percentile(good, 50) if good.size else np.nan)
        p99.append(np.percentile(good, 99) if good.size else np.nan)
        rate.append(sel.sum() / bin_s)
        fails.append((sel & ~ok).sum())
    marks = json.loads((out_dir / "marks.json").read_text()) if (out_dir / "marks.json").exists() else []

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.plot(mid, p50, label="p50")
    ax1.plot(mid, p99, label="p99")
    ax1.set_ylabel("completion latency (ms)")
    ax1.legend(loc="upper left")
    ax2.plot(mid, rate, label="completions / s", color="tab:green")
    if any(fails):
        ax2.bar(mid, fails, width=bin_s * 0.8, color="tab:red", label="failed")
    ax2.set_ylabel("per second")
    ax2.set_xlabel("seconds since the first request")
    ax2.legend(loc="upper left")
    for m in marks:
        x = m["at"] - t0
        for ax in (ax1, ax2):
            ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax1.annotate(
            m["what"], (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top", ha="right"
        )
    ax1.set_title(title)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png = out_dir / "latency.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
