"""benchmarks.trainer's sharding half (issue 19), side by side in one run:

- ours vs transformers: one training step (forward, cross-entropy, backward, AdamW) of our compact model
  and of transformers' Qwen3MoeForCausalLM loaded from the same checkpoint, same batch, alternating;
- FSDP2 vs DP memory: the real trainer (online_rl.trainer.loop, 2 gloo ranks, rank 0 driving, rank 1 following
  its commands, KL reference on) on a preset of ~290M parameters, where parameters, gradients, AdamW state
  and the reference dominate; each mode in fresh processes started as `flywheel train` starts its ranks
  (online_rl.trainer.ranks.spawn), peak RSS per rank (ru_maxrss), tokens/s.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch

# Parameters, gradients and optimizer state dominate: ~290M parameters (67M of them embedding and head).
LARGE = dict(
    vocab_size=32768,
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
)
# The peer comparison: a Qwen3-MoE shaped like the public ones, scaled to what 2 cores train in seconds.
PEER = dict(
    vocab_size=8192,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
)


def _checkpoint(cfg: dict, out: Path) -> Path:
    from online_rl.model.transformer import ModelConfig, MoECoder, save_pretrained

    if not (out / "config.json").exists():
        m = MoECoder(ModelConfig(**cfg))
        m.init_weights(0)
        save_pretrained(m, out, torch.float32)
    return out


def ours_vs_transformers(tmp: Path, batch: int = 8, seq: int = 256, steps: int = 7) -> dict:
    from transformers import AutoModelForCausalLM

    from online_rl.model.transformer import load_pretrained

    torch.set_num_threads(2)
    path = _checkpoint(PEER, tmp / "peer")
    ours = load_pretrained(path).train()
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    tokens = torch.randint(0, PEER["vocab_size"], (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    opts = {
        "ours": torch.optim.AdamW(ours.parameters(), lr=1e-4),
        "transformers": torch.optim.AdamW(theirs.parameters(), lr=1e-4),
    }

    def step(name: str) -> float:
        model, opt = (ours, opts["ours"]) if name == "ours" else (theirs, opts["transformers"])
        t = time.perf_counter()
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    times: dict[str, list[float]] = {"ours": [], "transformers": []}
    for i in range(steps + 1):
        for name in ("ours", "transformers") if i % 2 else ("transformers", "ours"):  # alternate who goes first
            s = step(name)
            if i:  # the first of each warms up
                times[name].append(s)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ours_step_s": round(med["ours"], 4),
        "transformers_step_s": round(med["transformers"], 4),
        "ours_vs_transformers_step_ratio": round(med["transformers"] / med["ours"], 3),
        "peer_step": {
            "config": PEER,
            "batch": [batch, seq],
            "transformers_experts_implementation": getattr(theirs.config, "_experts_implementation", None),
            "params": sum(p.numel() for p in ours.parameters()),
        },
    }


def _samples(cfg: dict, n: int, prompt: int, output: int, seed: int = 0):
    from online_rl.data.samples import Sample

    rng = np.random.default_rng(seed)
    L, K, E = cfg["num_hidden_layers"], cfg["num_experts_per_tok"], cfg["num_experts"]
    out = []
    for i in range(n):
        experts = np.stack([rng.permutation(E)[:K] for _ in range((prompt + output - 1) * L)])
        out.append(
            Sample(
                key=str(i),
                prompt_ids=rng.integers(1, cfg["vocab_size"], prompt),
                output_ids=rng.integers(1, cfg["vocab_size"], output),
                behaviour_logprobs=np.full(output, -5.0, np.float32),
                routed_experts=experts.reshape(prompt + output - 1, L, K).astype(np.uint8),
                reward=float(i % 2),
                model_version=0,
            )
        )
    return out


def _rank(rank: int, size: int, port: int, model_dir: str, shard: str, samples, steps: int, out: str) -> None:
    import torch.distributed as dist

    from online_rl.config import OptimConfig, ShardConfig, TrainerConfig
    from online_rl.trainer.loop import Trainer
    from online_rl.trainer.ranks import command, worker_loop

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    cfg = TrainerConfig(
        model_dir=Path(model_dir),
        work_dir=Path(out).parent / f"work-{shard}",
        min_batch=1,
        batch_size=len(samples),
        optim=OptimConfig(micro_batch=len(samples)),
        sharding=ShardConfig(shard=shard),
    )
    trainer = Trainer(cfg)
    if rank == 0:
        tokens, seconds = 0, 0.0
        for i in range(steps + 1):
            trainer.buffer = list(samples)
            m = trainer.train_step(force=True)
            if i:  # the first warms up
                tokens, seconds = tokens + m["tokens"], seconds + m["step_s"]
        command(("stop",))
    else:
        worker_loop(trainer)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])  # KiB -> MiB
    every = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(every, rss)
    if rank == 0:
        Path(out).write_text(
            json.dumps({"tokens_per_s": tokens / seconds, "peak_rss_mb": [round(float(t), 1) for t in every]})
        )
    dist.destroy_process_group()


def fsdp_vs_dp(tmp: Path, steps: int = 2) -> dict:
    from infra.procs import free_port
    from online_rl.trainer.ranks import spawn

    path = _checkpoint(LARGE, tmp / "large")
    samples = _samples(LARGE, 4, 48, 16)
    res = {}
    for shard in ("dp", "fsdp"):
        out = tmp / f"{shard}.json"
        spawn(_rank, (2, free_port(), str(path), shard, samples, steps, str(out)), 2)  # as `flywheel train` does
        res[shard] = json.loads(out.read_text())
    n_params = sum(np.prod(v) for v in _shapes(path).values())
    dp, fsdp = max(res["dp"]["peak_rss_mb"]), max(res["fsdp"]["peak_rss_mb"])
    return {
        "fsdp2_peak_rss_mb_per_rank": fsdp,
        "dp_peak_rss_mb_per_rank": dp,
        "fsdp2_vs_dp_peak_rss": round(fsdp / dp, 3),
        "fsdp2_tokens_per_s_2proc_large": round(res["fsdp"]["tokens_per_s"], 1),
        "dp_tokens_per_s_2proc_large": round(res["dp"]["tokens_per_s"], 1),
        "memory_preset": {"config": LARGE, "params": int(n_params), "samples": len(samples), "tokens_each": 64},
    }


def _shapes(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
