"""One optimizer step over a list of samples, on one process or data-parallel over several (gloo on CPU,
the same calls take NCCL on GPUs): rank 0 hands every rank the whole batch, each rank takes its shard,
gradients are summed across ranks, and every rank steps identically."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from online_rl.config import LossConfig, OptimConfig
from online_rl.loss import make_batch, policy_loss
from online_rl.model import MoECoder
from online_rl.samples import Sample


def make_optimizer(model: MoECoder, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share_batch(samples: list[Sample] | None, adv: np.ndarray | None) -> tuple[list[Sample], np.ndarray]:
    """Rank 0's batch, on every rank."""
    rank, size = world()
    if size == 1:
        return samples, adv
    box = [(samples, adv) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _allreduce_grads(model: MoECoder) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def update(
    model: MoECoder,
    ref: MoECoder | None,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    adv: np.ndarray,
    loss_cfg: LossConfig,
    optim_cfg: OptimConfig,
) -> dict:
    """Every rank calls this with the same samples; returns metrics (rank 0's view)."""
    rank, size = world()
    t0 = time.perf_counter()
    mine = list(range(rank, len(samples), size))
    opt.zero_grad(set_to_none=False)
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    metrics: dict = {"samples": len(samples), "tokens": 0}
    mismatch, kl_sum = 0.0, 0.0
    for start in range(0, len(mine), optim_cfg.micro_batch):
        idx = mine[start : start + optim_cfg.micro_batch]
        # A dense model has no router: its samples' routing (if any) is not replayed.
        replay = loss_cfg.router_replay and model.cfg.is_moe
        batch = make_batch([samples[i] for i in idx], adv[idx], replay=replay)
        loss, m = policy_loss(model, ref, batch, loss_cfg, denominator=len(samples))
        loss.backward()
        metrics["tokens"] += m["tokens"]
        mismatch = max(mismatch, m["logprob_mismatch_max"])
        kl_sum += m["kl_per_token"] * m["tokens"]
    if size > 1:
        _allreduce_grads(model)
        counts = torch.tensor([float(metrics["tokens"]), kl_sum, mismatch])
        dist.all_reduce(counts[:2], op=dist.ReduceOp.SUM)
        m3 = counts[2:].clone()
        dist.all_reduce(m3, op=dist.ReduceOp.MAX)
        metrics["tokens"], kl_sum, mismatch = int(counts[0]), float(counts[1]), float(m3[0])
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim_cfg.grad_clip)
    opt.step()
    metrics.update(
        kl_per_token=kl_sum / max(1, metrics["tokens"]),
        logprob_mismatch_max=mismatch,
        grad_norm=float(norm),
        step_s=time.perf_counter() - t0,
    )
    metrics["tokens_per_s"] = metrics["tokens"] / max(1e-9, metrics["step_s"])
    return metrics
