"""Section 1 of the prepared GPU check: an FSDP2 training step of the trainer's model on one device.

A one-rank process group (NCCL on a GPU, gloo on the CPU smoke run), the model built on the meta device,
materialised on the device and initialised by `init_weights`, sharded as the trainer shards it
(online_rl.trainer.sharding.shard: each decoder block then the root, bf16 compute, fp32 gradient reduction), AdamW,
next-token cross-entropy on one fixed batch of random tokens (so the loss falls as the model memorises it).
Reports tokens/s over the timed steps, their seconds, peak device memory and the losses.
"""

from __future__ import annotations

import socket
import statistics
import time
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from online_rl.gpu_check.sections import Budget, sync
from online_rl.model.transformer import ModelConfig, MoECoder


@dataclass
class Preset:
    cfg: ModelConfig
    batch: int
    seq: int
    warmup: int
    steps: int
    lr: float


PRESETS = {
    # ~0.7B parameters (~0.14B active a token): 12 layers of 16 experts, top-2; 16k tokens a step
    "h200": Preset(
        ModelConfig(
            vocab_size=32768,
            hidden_size=1024,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            num_experts=16,
            num_experts_per_tok=2,
            moe_intermediate_size=1024,
            max_position_embeddings=1024,
        ),
        batch=16,
        seq=1024,
        warmup=2,
        steps=8,
        lr=3e-4,
    ),
    "tiny": Preset(ModelConfig(), batch=4, seq=64, warmup=2, steps=3, lr=1e-3),  # the CPU smoke run
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def param_counts(cfg: ModelConfig, model: torch.nn.Module) -> tuple[int, int]:
    """All parameters, and those one token uses (the experts' share scaled by top-k / experts)."""
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total, total - experts + experts * cfg.num_experts_per_tok // cfg.num_experts


def fsdp_step(budget: Budget, device: torch.device, preset: Preset, log=print) -> dict:

    own_group = not dist.is_initialized()
    if own_group:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return _train(budget, device, preset, log)
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(budget: Budget, device: torch.device, preset: Preset, log) -> dict:
    from online_rl.config import ShardConfig
    from online_rl.trainer.sharding import shard

    cfg = preset.cfg
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = MoECoder(cfg)
    model.to_empty(device=device)
    model.init_weights(seed=0)
    total, active = param_counts(cfg, model)
    shard(model, ShardConfig(shard="fsdp", param_dtype="bfloat16"), device)
    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (preset.batch, preset.seq + 1), generator=g).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    setup_s = time.perf_counter() - t0
    log(f"  model: {total / 1e9:.3f} B params ({active / 1e9:.3f} B active), set up in {setup_s:.1f} s")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    losses: list[float] = []
    step_s: list[float] = []
    for step in range(preset.warmup + preset.steps):
        if step > preset.warmup and budget.left() < 3 * step_s[-1]:
            log(f"  stopping after {step} steps: {budget.left():.0f} s of the budget left")
            break
        sync(device)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # Block returns views; harmless here
            out = model(inputs)
            loss = F.cross_entropy(out.logits.float().flatten(0, 1), targets.flatten())
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))  # synchronises
        sync(device)
        step_s.append(time.perf_counter() - t)
        log(f"  step {step}{' (warm-up)' if step < preset.warmup else ''}: loss {losses[-1]:.4f}, {step_s[-1]:.3f} s")

    timed = step_s[preset.warmup :]
    if not timed:
        raise RuntimeError("no timed step within the budget")
    tokens_per_step = preset.batch * preset.seq
    median_s = statistics.median(timed)
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    result = {
        "ok": finite and losses[-1] < losses[0],
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "preset": {**asdict(cfg), "batch": preset.batch, "seq": preset.seq, "lr": preset.lr},
        "params": total,
        "active_params_per_token": active,
        "param_dtype": "bfloat16",
        "setup_s": round(setup_s, 2),
        "tokens_per_step": tokens_per_step,
        "warmup_steps": preset.warmup,
        "timed_steps": len(timed),
        "step_s": [round(s, 4) for s in step_s],
        "step_s_median": round(median_s, 4),
        "tokens_per_s": round(tokens_per_step / median_s, 1),
        "model_tflops_6n_active": round(6 * active * tokens_per_step / median_s / 1e12, 2),
        "losses": [round(x, 4) for x in losses],
        "loss_decreased": losses[-1] < losses[0],
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        result["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 2)
    return result
