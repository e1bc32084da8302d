"""The low-change preset's switch time (issue #51, part 3): real consecutive versions of the trainer's update at the
preset's setting, each published as a signed delta against the one before, and one SGLang replica on CPU switched
to each by the weight-sync agent, in place and, side by side, by a reload of the same version.

The versions: the in-process learning loop of benchmarks._change_vs_learning (run_setting: the trainer's update,
users served each version as published, in bf16) on the demo preset's model (the test model where the demo's is
not cached: no model is built here), at the preset's setting (online_rl.config.LOW_CHANGE: lr 1e-5, one optimizer
step a version of 8 requests) and, for comparison, at the learning benchmark's (lr 2e-4, two passes a version of
32: the regime the demo shows). The first VERSIONS versions of each run are written as checkpoint directories (the
base model's tensors in its order and its side files, as the trainer's publisher exports them) and published with
weight_sync.publish, the trainer's path, into a store of their own: v0 the base model, each later version a delta
against the one before, signed; `flywheel weights serve` serves it.

The switches: for each version k, a fresh agent (benchmarks._delta_inplace.switch_agent) of the replica serving
v(k-1) switches it to vk, once in place and once by a reload from disk, in alternating order from one version to
the next; before each, the replica is put back on v(k-1) if it is not there (untimed). Switch time: the agent's
serving_ms, from its starting on the version to the replica answering with it (fetch, rebuild or patch included;
the store on loopback). Both ways must give the same greedy tokens and logprobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks import _change_vs_learning as change
from benchmarks._delta_inplace import greedy, same, switch_agent, timed_switch
from weight_sync.checkpoint import SIDE_FILES, CheckpointReader, CheckpointWriter

VERSIONS = 4  # consecutive versions published and switched to, per setting
EVAL_TASKS = 16  # the loop's evaluation: its acceptance is not a figure here (benchmarks._change_vs_learning's is)
# key prefix -> (lr, optimizer steps per update, rounds per version, requests per round), as in change.SETTINGS
SETTINGS = {"preset": change.PRESET_SETTING, "learning_setting": change.SETTINGS[0]}


@dataclasses.dataclass
class Versions:
    """One setting's run: its checkpoints (v0 the base model), its store and each version's publish result."""

    store: Path
    checkpoints: list[Path]
    published: list  # weight_sync.publish.PublishResult of v1..vN
    run: dict  # change.run_setting's result (the first len(published) versions are these)


def write_checkpoint(weights: dict, base: Path, out: Path) -> Path:
    """A checkpoint directory of `weights` (bf16, as learning.published gives them) in the layout of `base`: its
    tensors in its order and its side files (what the trainer's publisher writes)."""
    out.mkdir(parents=True)
    with CheckpointReader(base) as r:
        specs = r.specs()
    missing = sorted(set(specs) - set(weights))
    if missing or any(dtype != "BF16" for dtype, _ in specs.values()):
        raise ValueError(f"{base} is not the weights' bf16 model (missing {missing[:5]})")
    w = CheckpointWriter(out / "model.safetensors", [(n, d, s) for n, (d, s) in specs.items()])
    for name in specs:
        w.write(name, change.bits(weights[name]))
    w.close()
    for name in SIDE_FILES:
        if (base / name).exists():
            shutil.copyfile(base / name, out / name)
    return out


def make_versions(
    setting: tuple,
    n: int,
    model_dir: Path,
    work: Path,
    key: Path,
    preset: str,
    seed: int = 0,
    threads: int = 1,
    **loop,
) -> Versions:
    """The first `n` versions of a run of the learning loop at `setting`, published as deltas into work/store
    (`loop`: other LearningConfig fields, as change.run_setting takes them)."""
    from weight_sync.publish import PublishConfig, publish

    lr, epochs, rounds, per_round = setting
    pcfg = PublishConfig(store=work / "store", private_key=key)
    publish(model_dir, pcfg)  # v0: the base model, as a trainer's first publish
    v = Versions(pcfg.store, [model_dir], [], {})

    def keep(weights: dict) -> None:
        if len(v.published) < n:
            v.checkpoints.append(write_checkpoint(weights, model_dir, work / f"v{len(v.checkpoints)}"))
            v.published.append(publish(v.checkpoints[-1], pcfg, announce_now=False))

    # one version more than needed: a round whose requests were all ignored makes none
    budget = (n + 1) * per_round * rounds
    v.run = change.run_setting(
        lr, epochs, rounds, budget, model_dir, work / "loop", seed, per_round, threads, preset, keep
    )
    if len(v.published) < n:
        raise RuntimeError(f"the run at {setting} made {len(v.published)} versions, not {n}")
    return v


def whole_tensors(old: Path, new: Path) -> tuple[int, int]:
    """How many tensors of `new` changed too much over `old` to travel sparse in an in-place patch (they go whole:
    over weight_patch.format.SPARSE_MAX_SHARE of their elements), of how many."""
    from weight_patch.format import travels_sparse

    with CheckpointReader(old) as a, CheckpointReader(new) as b:
        names = b.names()
        whole = sum(not travels_sparse(int((a.bits(n) != b.bits(n)).sum()), b.bits(n).size) for n in names)
    return whole, len(names)


async def put_back(replica_url: str, checkpoint: Path, version: int) -> None:
    """The replica on `version` (a reload of its checkpoint), unless it serves it already."""
    import aiohttp

    from weight_sync.agent.switch import served_version, switch

    async with aiohttp.ClientSession() as session:
        if await served_version(session, replica_url) != version:
            await switch(replica_url, str(checkpoint.resolve()), version, "no_pause")


def switch_versions(v: Versions, replica_url: str, store_url: str, public_key: Path, work: Path) -> dict:
    """Each version switched to from the one before, in place and by a reload (alternating which goes first)."""
    times: dict[str, list[float]] = {"in_place": [], "reload": []}
    rows = []
    for k in range(1, len(v.published) + 1):
        asyncio.run(put_back(replica_url, v.checkpoints[k - 1], k - 1))
        before = greedy(replica_url)
        answers, reports = {}, {}
        for how in ("in_place", "reload") if k % 2 else ("reload", "in_place"):
            asyncio.run(put_back(replica_url, v.checkpoints[k - 1], k - 1))
            agent = switch_agent(
                f"{how}-{k}", replica_url, store_url, public_key, work, v.checkpoints[k - 1], k - 1, how
            )
            reports[how], _ = timed_switch(agent, k)
            times[how].append(reports[how]["serving_ms"] / 1000)
            answers[how] = greedy(replica_url)
            shutil.rmtree(agent.work, ignore_errors=True)
        p = reports["in_place"]
        whole, tensors = whole_tensors(v.checkpoints[k - 1], v.checkpoints[k])
        rows.append(
            {
                "version": k,
                "in_place_s": times["in_place"][-1],
                "reload_s": times["reload"][-1],
                "same_answer_as_reload": same(answers["in_place"], answers["reload"]),
                "answer_changed": not same(answers["reload"], before),
                "patch_bytes": p["patch_bytes"],
                "patch_sparse_elems": p["patch_sparse_elems"],
                "patch_full_elems": p["patch_full_elems"],
                "tensors_whole": whole,
                "tensors": tensors,
            }
        )
    return {"times": times, "rows": rows}


def setting_figures(prefix: str, v: Versions, switched: dict) -> dict:
    """`prefix`'s keys: the versions' change (of the run's measure and of the store's deltas) and switch times."""
    n = len(v.published)
    versions = v.run["per_version"][:n]
    times = switched["times"]
    ratios = [i / r for i, r in zip(times["in_place"], times["reload"])]
    deltas = [r.published_bytes for r in v.published]
    return {
        f"{prefix}_switch_s_median": round(statistics.median(times["in_place"]), 3),
        f"{prefix}_reload_s_median": round(statistics.median(times["reload"]), 3),
        f"{prefix}_switch_vs_reload_median": round(statistics.median(ratios), 3),  # of each version's two switches
        f"{prefix}_switch_runs_s": [round(t, 3) for t in times["in_place"]],
        f"{prefix}_reload_runs_s": [round(t, 3) for t in times["reload"]],
        f"{prefix}_delta_mb_median": round(statistics.median(deltas) / 2**20, 4),
        f"{prefix}_delta_bytes": deltas,  # each version's delta in the store (manifest's chunks, signed)
        # raw bf16 bytes over the store's delta, each version (weight_sync.publish's ratio)
        f"{prefix}_switch_delta_ratio_median": round(statistics.median(r.ratio for r in v.published), 1),
        f"{prefix}_switch_delta_kinds": sorted({r.kind for r in v.published}),
        f"{prefix}_switch_identical_share": round(statistics.mean(x["identical_share"] for x in versions), 5),
        f"{prefix}_switch_identical_shares": [x["identical_share"] for x in versions],
        f"{prefix}_switch_same_answers": all(r["same_answer_as_reload"] for r in switched["rows"]),
        f"{prefix}_switch_versions": switched["rows"],
    }


def _model(preset: str, seed: int) -> tuple[Path, str]:
    """The preset's cached model, or the test model's where it is not cached (a build takes too long here)."""
    from online_rl.model.bootstrap import bootstrap, cached_dir
    from online_rl.model.presets import preset as preset_config

    if preset != "test" and not (cached_dir(preset_config(preset, seed)) / ".complete").exists():
        return bootstrap("test", seed, progress=False), f"test preset (seed {seed}; the {preset} model was not cached)"
    return bootstrap(preset, seed, progress=False), f"{preset} preset (seed {seed})"


def figures(versions: int = VERSIONS, preset: str = "demo", seed: int = 0, threads: int = 1) -> dict:
    """benchmarks.guard's switch keys: every setting of SETTINGS, one replica on the base model."""
    from benchmarks._store_server import serve_store
    from infra.procs import stop_pid
    from serving.replica.process import ReplicaConfig, start
    from weight_sync.manifest import generate_key

    model_dir, model = _model(preset, seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-preset-switch-"))
    try:
        generate_key(tmp / "k.pem", tmp / "k.pub")
        # the learning loops first, the replica not yet loaded: they do not share the cores with it
        runs = {
            p: make_versions(
                s, versions, model_dir, tmp / p, tmp / "k.pem", preset, seed, threads, eval_tasks=EVAL_TASKS
            )
            for p, s in SETTINGS.items()
        }
        out: dict = {
            "preset_switch_model": model,
            "preset_switch_settings": {
                p: dict(zip(("lr", "epochs", "rounds_per_version", "requests_per_round"), s))
                for p, s in SETTINGS.items()
            },
        }
        load = os.getloadavg()[0]
        replica = start(ReplicaConfig(model_path=model_dir, log_dir=tmp / "logs", max_total_tokens=4096, threads=1))
        try:
            for prefix, v in runs.items():
                proc, url = serve_store(v.store)
                try:
                    out.update(
                        setting_figures(prefix, v, switch_versions(v, replica.url, url, tmp / "k.pub", tmp / prefix))
                    )
                finally:
                    stop_pid(proc.pid)
        finally:
            replica.stop()
        out["preset_switch_load_avg_1min"] = [round(load, 1), round(os.getloadavg()[0], 1)]
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
