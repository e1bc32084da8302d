"""The trainer, side by side in one run: update-step throughput on 1 vs 2 data-parallel processes and on 2
FSDP2 processes (same batch, same 2 cores), stream ingest rate from a real broker, the train/serve
numerics of the demo model with router replay on and off, our training step vs transformers' on the same
Qwen3-MoE, and FSDP2 vs DP peak memory per rank on a ~290M-parameter preset (benchmarks._trainer_fsdp).
Prints one JSON object as the last line."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

STEPS = 4
BATCH = 32


def _samples(model_dir: Path, n: int):
    from tokenizers import Tokenizer

    from online_rl.data.simulate import as_samples, sample_completions
    from online_rl.model.transformer import load_pretrained
    from online_rl.tasks import synthetic as tasks

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = load_pretrained(model_dir)
    raw = sample_completions(
        model, tok, tasks.tasks("heldout")[: n // 4 + 1], 4, torch.Generator().manual_seed(0), max_tokens=32
    )[:n]
    return as_samples(raw, lambda i: i % 3 == 0, group_size=8)


def _rank(rank: int, size: int, port: int, model_dir: str, samples, out: str, shard: str = "dp") -> None:
    import torch.distributed as dist

    from online_rl.config import LossConfig, OptimConfig
    from online_rl.model.transformer import load_pretrained
    from online_rl.trainer.loss import advantages
    from online_rl.trainer.update import make_optimizer, update

    if size > 1 or shard == "fsdp":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.set_num_threads(max(1, 2 // size))
    model, ref = load_pretrained(Path(model_dir)), load_pretrained(Path(model_dir)).eval()
    if shard == "fsdp":
        from online_rl.config import ShardConfig
        from online_rl.trainer.sharding import shard as fully_shard

        fully_shard(model, ShardConfig(shard="fsdp"))
        fully_shard(ref, ShardConfig(shard="fsdp"))
    opt = make_optimizer(model, OptimConfig())
    adv, _ = advantages(samples, LossConfig(), 0.0)
    times, tokens = [], 0
    for step in range(STEPS + 1):
        m = update(model, ref, opt, samples, adv, LossConfig(), OptimConfig())
        if step:  # the first step warms up
            times.append(m["step_s"])
            tokens += m["tokens"]
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": sum(times), "tokens": tokens, "samples": len(samples) * STEPS}))
    if dist.is_initialized():
        dist.destroy_process_group()


def update_throughput(model_dir: Path, tmp: Path) -> dict:
    import torch.multiprocessing as mp

    from infra.procs import free_port

    samples = _samples(model_dir, BATCH)
    out = {}
    for size in (1, 2):
        path = tmp / f"rank{size}.json"
        if size == 1:
            _rank(0, 1, 0, str(model_dir), samples, str(path))
        else:
            mp.spawn(_rank, args=(2, free_port(), str(model_dir), samples, str(path)), nprocs=2)
        r = json.loads(path.read_text())
        out[f"tokens_per_s_{size}proc"] = round(r["tokens"] / r["seconds"], 1)
        out[f"samples_per_s_{size}proc"] = round(r["samples"] / r["seconds"], 2)
    path = tmp / "fsdp2.json"  # the same batch, FSDP2 over the same 2 processes
    mp.spawn(_rank, args=(2, free_port(), str(model_dir), samples, str(path), "fsdp"), nprocs=2)
    r = json.loads(path.read_text())
    out["fsdp2_tokens_per_s_2proc"] = round(r["tokens"] / r["seconds"], 1)
    out["update_batch"] = {
        "samples": len(samples),
        "mean_tokens": round(float(np.mean([s.n_tokens for s in samples])), 1),
    }
    return out


def ingest_rate(model_dir: Path, tmp: Path, pairs: int = 3000) -> dict:
    from flywheel.kafka import broker as kafka_broker
    from online_rl.config import TrainerConfig
    from online_rl.data.simulate import events_for, produce
    from online_rl.trainer.loop import Trainer

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
    try:
        one = _samples(model_dir, 8)
        fake = [one[i % len(one)] for i in range(pairs)]
        raw = [(s.prompt_ids.tolist(), s.output_ids.tolist(), s.behaviour_logprobs, s.routed_experts) for s in fake]
        produce(broker.bootstrap, events_for(raw, lambda o: "accept", prefix="ing"))
        trainer = Trainer(TrainerConfig(model_dir=model_dir, work_dir=tmp / "t", kafka_bootstrap=broker.bootstrap))
        t = time.perf_counter()
        while trainer.joiner.stats.joined < pairs and time.perf_counter() - t < 300:
            trainer.ingest()
        seconds = time.perf_counter() - t
        return {
            "ingest_events_per_s": round(2 * trainer.joiner.stats.joined / seconds, 1),
            "ingest_pairs": trainer.joiner.stats.joined,
        }
    finally:
        broker.stop()


def numerics(model_dir: Path) -> dict:
    from online_rl.numerics import measure
    from serving.replica.process import ReplicaConfig, start

    replica = start(ReplicaConfig(model_path=model_dir))
    try:
        return {"numerics": measure(replica.url, model_dir, prompts=24, max_tokens=32)}
    finally:
        replica.stop()


def main() -> dict:
    from online_rl.model.bootstrap import bootstrap

    model = bootstrap("demo", 0, progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    try:
        result = {}
        result.update(update_throughput(model, tmp))
        result.update(ingest_rate(model, tmp))
        result.update(numerics(model))
        from benchmarks._trainer_fsdp import fsdp_vs_dp, ours_vs_transformers

        result.update(ours_vs_transformers(tmp))
        result.update(fsdp_vs_dp(tmp))
        result["targets_met"] = {
            "fsdp2_peak_rss_le_0.65x_dp": result["fsdp2_vs_dp_peak_rss"] <= 0.65,
            "ours_step_at_least_as_fast_as_transformers": result["ours_vs_transformers_step_ratio"] >= 1.0,
            "replay_logprob_diff_le_1e-5": result["numerics"]["replay"]["max_abs_logprob_diff"] <= 1e-5,
            "replay_routing_disagreement_zero": result["numerics"]["replay"]["routing_disagreement"] == 0.0,
        }
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()))
