"""The update over a list of samples (its policy-gradient passes, PPO's epochs, and the distillation's own
step where configured), on one process or over several ranks (gloo on CPU, the same calls take NCCL on
GPUs): rank 0 hands every rank the whole batch, each rank takes its share of the sequences, gradients are
summed across ranks (one all-reduce of a whole copy under `dp`; FSDP2's reduce-scatter into each rank's
shard under `fsdp`, online_rl.trainer.sharding), and every rank steps."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from online_rl.config import LossConfig, OptimConfig
from online_rl.data.samples import DISTILL, Sample
from online_rl.model.transformer import MoECoder
from online_rl.trainer.loss import make_batch, policy_loss
from online_rl.trainer.sharding import sharded, to_float


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
        assert samples is not None and adv is not None, "rank 0 holds the batch"
        return samples, adv
    box: list[Any] = [(samples, adv) if rank == 0 else None]
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


class PartialUpdate(RuntimeError):
    """A pass after the first failed: the steps before it were applied, so the samples were trained on (their
    ledger and provenance must say so) and `metrics` are the first pass's; the failure is `__cause__`."""

    def __init__(self, metrics: dict, steps: int):
        super().__init__(f"the update failed after {steps} optimizer step(s) were applied")
        self.metrics, self.steps = metrics, steps


def update(
    model: MoECoder,
    ref: MoECoder | None,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    adv: np.ndarray,
    loss_cfg: LossConfig,
    optim_cfg: OptimConfig,
) -> dict:
    """Every rank calls this with the same samples: optim_cfg.epochs passes over them, one optimizer step each,
    then, under loss_cfg.distill_step, one step of the distillation alone over the samples with a hint (the
    passes before it leave the distillation and the student's fresh samples out). Returns the first pass's
    metrics (rank 0's view: the behaviour-vs-trainer mismatch means something before any step; `tokens` one
    policy-gradient pass's) with the time of them all, the optimizer steps taken, tokens a second over every
    pass, and the last pass's gradient norm and the distillation step's beside the first. A failure after the
    first step raises PartialUpdate: what was applied stays applied."""
    t0 = time.perf_counter()
    hinted = [i for i, s in enumerate(samples) if s.hint_ids is not None and s.hint_ids.size]
    own = bool(loss_cfg.distill_step and loss_cfg.distill_coef and hinted)
    pg, pg_cfg = list(range(len(samples))), loss_cfg
    if own:
        pg, pg_cfg = [i for i, s in enumerate(samples) if s.source != DISTILL], replace(loss_cfg, distill_coef=0.0)
    pg_samples, pg_adv = [samples[i] for i in pg], adv[pg]
    metrics = _one_pass(model, ref, opt, pg_samples, pg_adv, pg_cfg, optim_cfg)
    steps, trained = 1, metrics["tokens"]
    try:
        for _ in range(optim_cfg.epochs - 1):
            last = _one_pass(model, ref, opt, pg_samples, pg_adv, pg_cfg, optim_cfg)
            metrics["grad_norm_last"], steps, trained = last["grad_norm"], steps + 1, trained + last["tokens"]
        if own:  # advantages 0: the distillation and the KL to the reference, nothing else
            d = _one_pass(model, ref, opt, [samples[i] for i in hinted], np.zeros(len(hinted)), loss_cfg, optim_cfg)
            metrics.update(
                distill_kl_per_token=d["distill_kl_per_token"],
                distill_tokens=d["distill_tokens"],
                grad_norm_distill=d["grad_norm"],
            )
            steps, trained = steps + 1, trained + d["tokens"]
    except Exception as e:  # e.g. the teacher's forward out of memory after the policy gradient had stepped
        opt.zero_grad(set_to_none=True)
        raise PartialUpdate(_timed(metrics, steps, trained, t0), steps) from e
    return _timed(metrics, steps, trained, t0)


def _timed(metrics: dict, steps: int, trained: int, t0: float) -> dict:
    metrics.update(steps=steps, step_s=time.perf_counter() - t0)
    metrics["tokens_per_s"] = trained / max(1e-9, metrics["step_s"])  # every pass's tokens
    return metrics


def _one_pass(
    model: MoECoder,
    ref: MoECoder | None,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    adv: np.ndarray,
    loss_cfg: LossConfig,
    optim_cfg: OptimConfig,
) -> dict:
    """One optimizer step over the samples (gradients accumulated over micro-batches, summed across ranks)."""
    rank, size = world()
    fsdp = sharded(model)
    device = next(model.parameters()).device
    mine = list(range(rank, len(samples), size))
    if fsdp:
        opt.zero_grad(set_to_none=True)
    else:  # every parameter a gradient, so that one flat all-reduce covers them all
        opt.zero_grad(set_to_none=False)
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    metrics: dict = {"samples": len(samples), "tokens": 0}
    mismatch, kl_sum = 0.0, 0.0
    mb = optim_cfg.micro_batch
    replay = loss_cfg.router_replay and model.cfg.is_moe  # a dense model has no router: nothing to replay
    # One decision for the whole batch (every rank has it): each micro-batch then runs the same forwards.
    teacher = bool(loss_cfg.distill_coef) and any(s.hint_ids is not None for s in samples)
    distill = [0.0, 0.0]  # KL summed over hinted tokens, those tokens
    n_micro = -(-len(mine) // mb)
    if fsdp:  # each forward gathers parameters in collectives: every rank runs as many as rank 0 (the most)
        n_micro = -(-len(range(0, len(samples), size)) // mb)
    # FSDP reduce-scatters after every micro-batch's backward, into the sharded gradients: deferring it to the
    # last (set_requires_gradient_sync) would accumulate full-size unsharded gradients on every rank.
    for i in range(n_micro):
        idx = mine[i * mb : (i + 1) * mb]
        if not idx:  # FSDP, a rank with no sequence left: the collectives with a zero-weight forward
            batch = make_batch(samples[:1], adv[:1], replay=replay, teacher=teacher).to(device)
            (policy_loss(model, ref, batch, loss_cfg, denominator=len(samples))[0] * 0.0).backward()
            continue
        batch = make_batch([samples[j] for j in idx], adv[idx], replay=replay, teacher=teacher).to(device)
        loss, m = policy_loss(model, ref, batch, loss_cfg, denominator=len(samples))
        loss.backward()
        metrics["tokens"] += m["tokens"]
        distill[0] += m["distill_kl_sum"]
        distill[1] += m["distill_tokens"]
        mismatch = max(mismatch, m["logprob_mismatch_max"])
        kl_sum += m["kl_per_token"] * m["tokens"]
    if size > 1:
        if not fsdp:
            _allreduce_grads(model)
        counts = torch.tensor([float(metrics["tokens"]), kl_sum, *distill, mismatch], device=device)
        dist.all_reduce(counts[:4], op=dist.ReduceOp.SUM)
        m3 = counts[4:].clone()
        dist.all_reduce(m3, op=dist.ReduceOp.MAX)
        metrics["tokens"], kl_sum, mismatch = int(counts[0]), float(counts[1]), float(m3[0])
        distill = [float(counts[2]), float(counts[3])]
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim_cfg.grad_clip)
    opt.step()
    metrics.update(
        kl_per_token=kl_sum / max(1, metrics["tokens"]),
        logprob_mismatch_max=mismatch,
        distill_kl_per_token=distill[0] / max(1.0, distill[1]),  # on hinted tokens (0: none in this batch)
        distill_tokens=int(distill[1]),
        grad_norm=to_float(norm),
    )
    return metrics
