"""Figures of a trainer's run, drawn from what it writes (`history.json`), never by the daemon itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def reward_by_version(history_json: Path, out_png: Path) -> Path:
    """Acceptance and mean reward of the user samples each model version produced."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = json.loads(Path(history_json).read_text())
    versions = sorted(history, key=int)
    if not versions:
        raise ValueError(f"{history_json} holds no trained samples yet")
    mean = [
        (h["accepted"] / h["n"], h["reward"] / h["n"]) if h["n"] else (np.nan, np.nan)
        for h in map(history.get, versions)
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([int(v) for v in versions], [a for a, _ in mean], "o-", label="acceptance (user samples)")
    ax.plot([int(v) for v in versions], [r for _, r in mean], "s--", label="mean reward")
    ax.set_xlabel("model version that produced the samples")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)
