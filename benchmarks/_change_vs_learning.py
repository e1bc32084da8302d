"""Versions that change little: per-version change against learning speed, over the learning rate and the
optimizer steps per version (issue #51, part 3).

The in-process learning loop (benchmarks.learning: the trainer serving its own simulated users, `persist`
signals) on the test model, with `serve_published`: users and the evaluation get each version as the fleet would,
the trainer's float32 weights rounded to bf16. The trainer keeps float32 masters (AdamW's steps add up there), so
an update smaller than half a bf16 ulp of a weight leaves its published bits as they were until the steps since
add up to a boundary: the regime the delta codec (weight_sync.codec) was built for. A version is published every
`rounds_per_version` rounds of 32 or 8 requests (one update of that batch each, `epochs` optimizer steps per
update); per version:
the share of bf16 weights bit-identical to the previous version and the delta ratio (raw bf16 bytes over the bytes
weight_sync.codec codes the tensors in against the previous version: tensors only, no manifest). Learning speed:
the fixed evaluation's acceptance (benchmarks.learning.evaluate) at the start and over the run.

`python -m benchmarks._change_vs_learning` runs the sweep (SETTINGS) and writes
benchmarks/results/records/change_vs_learning.json and benchmarks/results/change_vs_learning.png; benchmarks.guard
runs the production preset alone (preset_figures). Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import learning
from online_rl.config import LOW_CHANGE, LOW_CHANGE_BATCH
from weight_sync import codec

RESULTS = learning.RESULTS
RECORD = "records/change_vs_learning.json"
VARIANT = "persist"
# (learning rate, optimizer steps per update, rounds per version, requests per round: one update a round)
SETTINGS = (
    (2e-4, 2, 1, 32),  # the learning benchmark's own (the regime the demo shows)
    (3e-5, 2, 1, 32),
    (3e-5, 1, 1, 32),  # the trainer's default rate
    (1e-5, 2, 1, 32),
    (1e-5, 1, 1, 32),
    (5e-6, 1, 1, 32),
    # smaller, more frequent versions: the same steps per judged request, a quarter of the change per version
    (1e-5, 2, 1, 8),
    (1e-5, 1, 1, 8),
    (5e-6, 2, 1, 8),
)
# The production preset's setting in the loop (online_rl.config.low_change): its rate and passes, a version an update.
PRESET_SETTING = (LOW_CHANGE.lr, LOW_CHANGE.epochs, 1, LOW_CHANGE_BATCH)


def bits(t: torch.Tensor) -> np.ndarray:
    """A bf16 tensor's bit patterns, flat (uint16)."""
    if t.dtype != torch.bfloat16:
        raise ValueError(f"expected a bf16 tensor, got {t.dtype}")
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).ravel()


def identical_share(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    """The share of bf16 elements whose bits are the same in both versions (1 - publish's changed_share)."""
    if old.keys() != new.keys():
        raise ValueError(f"the versions hold different tensors: {sorted(old.keys() ^ new.keys())[:5]}")
    same = sum(int((bits(old[k]) == bits(new[k])).sum()) for k in new)
    return same / max(1, sum(t.numel() for t in new.values()))


def delta_ratio(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    """Raw bf16 bytes over the bytes weight_sync.codec codes `new` in against `old` (publish's delta)."""
    raw = coded = 0
    for k, t in new.items():
        b = bits(t)
        raw += b.nbytes
        coded += sum(len(frame) for _, frame in codec.encode_tensor(b, bits(old[k])))
    return raw / max(1, coded)


def base_config(budget: int, requests_per_round: int = 32, preset: str = "test") -> learning.LearningConfig:
    return learning.LearningConfig(
        preset=preset,
        budget=budget,
        requests_per_round=requests_per_round,
        batch_size=requests_per_round,
        min_batch=max(1, requests_per_round // 2),
        eval_every=max(1, 96 // requests_per_round),  # every 96 requests
        eval_samples=1,
        eval_tasks=96,  # of the pool's 176
        window=64,
        serve_published=True,
        progress=False,
    )


def run_setting(
    lr: float,
    epochs: int,
    rounds_per_version: int,
    budget: int,
    model_dir: Path,
    work: Path,
    seed: int = 0,
    requests_per_round: int = 32,
    threads: int = 2,
    preset: str = "test",
    on_weights: Callable[[dict], None] | None = None,
    **loop,
) -> dict:
    """One setting's run: per version its change, and the acceptance curve. `preset`: the model's (its task
    pool); on_weights(weights): each version's bf16 weights, after its change was measured (to publish them);
    `loop`: other LearningConfig fields (eval_tasks=8: a cheaper, rougher curve)."""
    cfg = dataclasses.replace(
        base_config(budget, requests_per_round, preset), lr=lr, epochs=epochs, seed=seed, threads=threads, **loop
    )
    cfg.rounds_per_version = rounds_per_version
    prev: dict = {}
    versions: list[dict] = []

    def on_version(weights: dict, steps: int, judged: int) -> None:
        old = prev.get("w")
        if old is None:  # v0: the starting model, as published
            from online_rl.model.transformer import load_pretrained

            old = learning.published(load_pretrained(model_dir))
        versions.append(
            {
                "version": len(versions) + 1,
                "judged": judged,
                "optimizer_steps": steps,
                "identical_share": round(identical_share(old, weights), 5),
                "delta_ratio": round(delta_ratio(old, weights), 2),
            }
        )
        prev["w"] = weights
        if on_weights is not None:
            on_weights(weights)

    name = f"{lr:g}-{epochs}-{rounds_per_version}-{requests_per_round}"
    r = learning.run_variant(VARIANT, cfg, model_dir, work / name, on_version)
    curve = r["curve"]
    start = curve[0][1]
    tail = [a for _, a in curve[-2:]]
    shares = [v["identical_share"] for v in versions]
    return {
        "lr": lr,
        "epochs": epochs,
        "rounds_per_version": rounds_per_version,
        "requests_per_round": requests_per_round,
        "optimizer_steps_per_version": statistics.median(v["optimizer_steps"] for v in versions) if versions else 0,
        "versions": len(versions),
        "identical_share_mean": round(float(np.mean(shares)), 5) if shares else None,
        "identical_share_min": round(min(shares), 5) if shares else None,
        "delta_ratio_median": round(statistics.median(v["delta_ratio"] for v in versions), 2) if versions else None,
        "acceptance_start": start,
        # the last two evaluations' mean, less the first: one evaluation of 96 completions moves by 1/96 a pass
        "acceptance_gain": round(float(np.mean(tail)) - start, 4),
        "acceptance_max_gain": round(max(a for _, a in curve) - start, 4),
        "requests_to_gain_5pts": next((n for n, a in curve if a >= start + 0.05), None),
        "curve": curve,
        "per_version": versions,
        "wall_s": r["wall_s"],
    }


def preset_figures(budget: int = 384, seed: int = 0) -> dict:
    """benchmarks.guard's keys from a run of the production preset (online_rl.config.LOW_CHANGE)."""
    work = Path(tempfile.mkdtemp(prefix="flywheel-low-change-"))
    try:
        r = run_setting(*PRESET_SETTING[:3], budget, learning._model("test", seed), work, seed, PRESET_SETTING[3])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return preset_keys(r, budget)


def preset_keys(r: dict, budget: int) -> dict:
    """The keys of one run of the preset's setting (run_setting's result)."""
    return {
        "preset": {
            "name": "low-change",
            "lr": r["lr"],
            "epochs": r["epochs"],
            "requests_per_version": r["requests_per_round"] * r["rounds_per_version"],
            "budget": budget,
        },
        "preset_identical_share": r["identical_share_mean"],
        "preset_identical_share_min": r["identical_share_min"],
        "preset_delta_ratio_median": r["delta_ratio_median"],
        "preset_acceptance_gain": r["acceptance_gain"],
        "preset_acceptance_curve": r["curve"],
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        n = r.get("requests_per_round", 32) * r["rounds_per_version"]
        label = f"lr {r['lr']:g}, {r['optimizer_steps_per_version']:g} step(s) a version of {n} requests"
        line = a.plot(*zip(*r["curve"]), marker=".", label=label)[0]
        b.scatter(100 * r["identical_share_mean"], 100 * r["acceptance_gain"], color=line.get_color(), label=label)
        xy = (100 * r["identical_share_mean"], 100 * r["acceptance_gain"])
        b.annotate(f"{r['delta_ratio_median']:.0f}x", xy, textcoords="offset points", xytext=(-12, 6), fontsize=8)
    a.set_xlabel("judged requests")
    a.set_ylabel("acceptance (evaluation, served bf16 version)")
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    b.axvline(95, color="grey", ls="--", lw=0.8)
    b.axhline(0, color="grey", lw=0.8)
    b.set_xlabel("bf16 weights bit-identical per version (%, mean)")
    b.set_ylabel("acceptance gained over the run (points)")
    b.set_title("labels: delta ratio (median per version)", fontsize=9)
    b.grid(alpha=0.3)
    fig.suptitle("per-version change against learning speed (test model, seed 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def setting(r: dict) -> tuple:
    """A run's place in SETTINGS: (lr, epochs, rounds per version, requests per round)."""
    return (r["lr"], r["epochs"], r["rounds_per_version"], r.get("requests_per_round", 32))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._change_vs_learning", description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=384, help="judged requests per setting")
    ap.add_argument("--only", default=None, help="indices of SETTINGS to run, comma-separated (default: all)")
    ap.add_argument("--merge", action="store_true", help="keep the record's runs of the other settings")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results folder")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (1 on a machine shared with other work)")
    a = ap.parse_args(argv)
    chosen = [SETTINGS[int(i)] for i in a.only.split(",")] if a.only else list(SETTINGS)
    model_dir = learning._model("test", 0)
    work = Path(tempfile.mkdtemp(prefix="flywheel-change-"))
    runs = []
    try:
        for lr, epochs, k, n in chosen:
            runs.append(run_setting(lr, epochs, k, a.budget, model_dir, work, requests_per_round=n, threads=a.threads))
            r = runs[-1]
            _write(a, runs)  # after each setting: a sweep cut short keeps what it has done
            print(
                f"lr {lr:g} x{epochs} /{k} per {n}: identical {r['identical_share_mean']}, "
                f"ratio {r['delta_ratio_median']}, gain {r['acceptance_gain']}, {r['wall_s']} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = _write(a, runs)
    plot(out["runs"], a.out / "change_vs_learning.png")
    print(json.dumps(out), flush=True)
    return out


def _write(a: argparse.Namespace, runs: list[dict]) -> dict:
    path = a.out / RECORD
    if a.merge and path.exists():  # the other settings' runs as recorded, in SETTINGS' order
        new = {setting(r) for r in runs}
        old = [r for r in json.loads(path.read_text())["runs"] if setting(r) not in new]
        order = {s: i for i, s in enumerate(SETTINGS)}
        runs = sorted(old + runs, key=lambda r: order.get(setting(r), len(order)))
    out = {"model": "test preset (seed 0)", "variant": VARIANT, "budget_judged_requests": a.budget, "runs": runs}
    (a.out / "records").mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
