"""The policy-gradient update: advantages, batches with router replay, and the loss.

loss = ( sum over sequences and output tokens of  -m_t * min(rho_t, C) * A * log pi(t)
         + beta * (log pi(t) - log pi_ref(t))^2 / 2 ) / number of sequences
  rho_t = pi(t) / mu(t), mu the behaviour policy whose logprobs serving logged (truncated importance
  weight, no gradient through it: the sample may come from an older version, asynchronously);
  m_t   0 once the ratio has left PPO's trust region in the advantage's direction (A > 0 and
        rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low), else 1: the gradient of PPO's clipped
        surrogate, against the behaviour policy;
  A     group-relative for rollouts (reward - group mean), reward - running baseline for user samples (one
        baseline per kind of judgment, Sample.baseline: users' own accepts and rejects, agent turns judged by
        their session's outcome, verdicts read from agent sessions), after a concave length penalty on the
        token count (Composer 2: coef * n ** power);
  0 for the student's fresh samples of a commented context (online_rl.data.distill_samples: no reward, only
        the distillation and KL-to-reference terms train on them);
  the KL term is k2 against the frozen reference (the bootstrap model); k1 is what /metrics reports;
  no length normalisation: tokens are summed, sequences averaged.
Text-feedback distillation adds, for each sample whose user commented on it (Sample.hint_ids) and for
LossConfig.distill_samples fresh samples of its context by the current student (online_rl.data.distill_samples),
  + gamma * sum over its output tokens t of  KL( pi(. | served context, y<t) || sg[pi(. | context + hint, y<t)] )
  the teacher is the same model, no gradient, with the user's words inserted as a hint line just before the
  completion; the student is the model on the served context. The KL is the reverse one (student first) and
  exact: summed over the whole vocabulary at each position, since both rows of logits are at hand, rather than
  the one-sample estimate log pi(y_t) - log teacher(y_t), which is the same in expectation with variance on
  top. Reverse because it is on-policy distillation: the positions are the student's own samples (the
  completion as served), and the mode-seeking direction moves the student's mass onto what the teacher
  wants there, instead of spreading it over everything the teacher allows (forward KL); it is zero where
  the hint changes nothing, so only the tokens the comment concerns move. A commented served sample keeps
  its policy-gradient and KL terms; a fresh one has the KL term and no policy gradient (advantage 0). Sequences
  averaged: over all of the batch's, fresh ones included. Under LossConfig.distill_step the term is an optimizer
  step of its own instead (online_rl.trainer.update): the policy-gradient passes leave it and the fresh samples out,
  then
  one step over the hinted samples with advantages 0 trains it (with the KL to the reference) alone.
The forward replays the experts serving chose (router replay), so training scores exactly the routes
that produced the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from online_rl.config import LossConfig
from online_rl.data.samples import DISTILL, Sample
from online_rl.model.transformer import MoECoder, token_logprobs


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) token ids (prompt + output minus the last token), right-padded
    targets: torch.Tensor  # (B, T) the next tokens
    mask: torch.Tensor  # (B, T) 1 on output tokens
    behaviour: torch.Tensor  # (B, T) serving's logprobs at output positions, 0 elsewhere
    replay: torch.Tensor | None  # (B, T, L, K) experts serving routed each position to
    advantages: torch.Tensor  # (B,)
    n_tokens: int
    # Distillation (every sample, so that every micro-batch runs the same forwards: FSDP's collectives):
    teacher_inputs: torch.Tensor | None = None  # (B, T + H) prompt + hint + output minus the last token
    teacher_pos: torch.Tensor | None = None  # (B, T) the teacher position scoring the same token as each input's
    distill_mask: torch.Tensor | None = None  # (B, T) 1 on output tokens of samples with a hint

    def to(self, device: torch.device) -> "Batch":
        if device.type == "cpu":
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(  # type: ignore[call-arg]  # the fields in order: mypy cannot count a generator's items
            *(move(t) for t in (self.inputs, self.targets, self.mask, self.behaviour, self.replay, self.advantages)),  # type: ignore[arg-type]
            self.n_tokens,
            *(move(t) for t in (self.teacher_inputs, self.teacher_pos, self.distill_mask)),
        )


def as_baselines(b: dict[str, float] | float) -> dict[str, float]:
    """The running baselines by Sample.baseline; a float is the explicit one (checkpoints before implicit signals)."""
    return dict(b) if isinstance(b, dict) else {"explicit": float(b)}


def advantages(
    samples: list[Sample], cfg: LossConfig, baseline: dict[str, float] | float
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-sample advantages; returns them and the updated running baselines of user rewards, one per
    Sample.baseline (a float: the explicit one, as checkpoints before implicit signals kept it)."""
    baselines = as_baselines(baseline)
    shaped = np.array([s.reward - cfg.length_penalty(s.n_tokens) for s in samples], dtype=np.float64)
    adv = np.zeros(len(samples))
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        if s.group is not None:
            groups.setdefault(s.group, []).append(i)
    for idx in groups.values():
        r = shaped[idx]
        a = r - r.mean()
        if cfg.group_std and r.std() > 1e-6:
            a = a / r.std()
        adv[idx] = a
    users: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        if s.group is None and s.source != DISTILL:
            users.setdefault(s.baseline, []).append(i)
    for kind, idx in users.items():
        b = baselines.get(kind, 0.0)
        adv[idx] = shaped[idx] - b
        baselines[kind] = cfg.baseline_momentum * b + (1 - cfg.baseline_momentum) * float(shaped[idx].mean())
    return adv, baselines


def make_batch(samples: list[Sample], adv: np.ndarray, replay: bool = True, teacher: bool = False) -> Batch:
    """teacher: also the hinted sequences of text-feedback distillation (a sample without a hint gets its own
    sequence and no distillation mask)."""
    B = len(samples)
    T = max(s.prompt_ids.size + s.output_ids.size - 1 for s in samples)
    L, K = samples[0].routed_experts.shape[1:] if replay else (0, 0)
    inputs = torch.zeros(B, T, dtype=torch.long)
    targets = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    behaviour = torch.zeros(B, T)
    experts = torch.zeros(B, T, L, K, dtype=torch.long)
    experts[..., :] = torch.arange(K)  # distinct ids on padding positions (never scored)
    for b, s in enumerate(samples):
        seq = np.concatenate([s.prompt_ids, s.output_ids]).astype(np.int64)
        n, p = seq.size - 1, s.prompt_ids.size
        inputs[b, :n] = torch.from_numpy(seq[:-1])
        targets[b, :n] = torch.from_numpy(seq[1:])
        mask[b, p - 1 : n] = 1.0
        behaviour[b, p - 1 : n] = torch.from_numpy(
            np.array(s.behaviour_logprobs, dtype=np.float32)
        )  # a copy: events are read-only
        if replay:
            if s.routed_experts.shape[0] != n:
                raise ValueError(f"sample {s.key}: {s.routed_experts.shape[0]} routed positions for {n} inputs")
            experts[b, :n] = torch.from_numpy(s.routed_experts.astype(np.int64))
    batch = Batch(
        inputs,
        targets,
        mask,
        behaviour,
        experts if replay else None,
        torch.tensor(adv, dtype=torch.float32),
        int(mask.sum().item()),
    )
    if teacher:
        _add_teacher(batch, samples, T)
    return batch


def _add_teacher(batch: Batch, samples: list[Sample], T: int) -> None:
    hints = [np.zeros(0, np.int64) if s.hint_ids is None else np.asarray(s.hint_ids, np.int64) for s in samples]
    B, H = len(samples), max(h.size for h in hints)
    batch.teacher_inputs = torch.zeros(B, T + H, dtype=torch.long)
    batch.teacher_pos = torch.zeros(B, T, dtype=torch.long)
    batch.distill_mask = torch.zeros(B, T)
    for b, (s, h) in enumerate(zip(samples, hints)):
        p, h_len = s.prompt_ids.size, h.size
        seq = np.concatenate([s.prompt_ids, h, s.output_ids]).astype(np.int64)
        n = seq.size - 1  # = the student's n + h_len
        batch.teacher_inputs[b, :n] = torch.from_numpy(seq[:-1])
        pos = torch.arange(n - h_len)
        pos[p - 1 :] += h_len  # an output token's teacher position: after the hint
        batch.teacher_pos[b, : n - h_len] = pos
        if h_len:
            batch.distill_mask[b] = batch.mask[b]


def policy_loss(
    model: MoECoder, ref: MoECoder | None, batch: Batch, cfg: LossConfig, denominator: int
) -> tuple[torch.Tensor, dict]:
    """Loss of this batch (a data-parallel shard divides by the global number of sequences)."""
    out = model(batch.inputs, batch.replay)
    logp = token_logprobs(out.logits, batch.targets)  # (B, T)
    with torch.no_grad():
        rho = torch.exp(logp - batch.behaviour) * batch.mask
        adv = batch.advantages[:, None]
        # Without the trust region, many updates on one version's samples keep pushing: measured, 100 steps
        # on 1,093 served samples of v0 collapsed the model (pass rate 50% -> 23%, then 0% live); with it
        # a stale sample stops pulling once the policy has moved past the clip for it.
        moved = ((adv > 0) & (rho > 1 + cfg.clip_high)) | ((adv < 0) & (rho < 1 - cfg.clip_low))
        weight = rho.clamp(max=cfg.is_cap) * (~moved)
    pg = -(weight * adv * logp * batch.mask).sum()
    loss = pg
    kl_tok = torch.zeros(())
    if ref is not None and cfg.kl_coef:
        with torch.no_grad():
            ref_logp = token_logprobs(ref(batch.inputs, batch.replay).logits, batch.targets)
        diff = (logp - ref_logp) * batch.mask
        # k2 = (log pi - log ref)^2 / 2 as the loss: its gradient (log pi - log ref) grad log pi is the KL's;
        # k1's own gradient, grad log pi, is zero in expectation and only pushes sampled tokens down.
        loss = loss + cfg.kl_coef * 0.5 * (diff**2).sum()
        kl_tok = diff.sum().detach() / max(1, batch.n_tokens)  # reported: the k1 estimate of KL per token
    distill_kl = torch.zeros(())
    if batch.teacher_inputs is not None and cfg.distill_coef:
        assert batch.teacher_pos is not None and batch.distill_mask is not None, "made with teacher_inputs"
        with torch.no_grad():
            t_logits = model(batch.teacher_inputs, None).logits  # its own routing: the hint has no served route
            V = t_logits.shape[-1]
            t_logp = torch.log_softmax(t_logits.float().gather(1, batch.teacher_pos[..., None].expand(-1, -1, V)), -1)
        s_logp = torch.log_softmax(out.logits.float(), -1)  # (B, T, V)
        kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1) * batch.distill_mask  # (B, T) reverse KL per position
        loss = loss + cfg.distill_coef * kl.sum()
        distill_kl = kl.sum().detach()
    loss = loss / denominator
    m = batch.mask.bool()
    metrics = {
        "kl_per_token": float(kl_tok),
        "rho_mean": float(rho[m].mean()) if m.any() else 1.0,
        "truncated_share": float((rho[m] > cfg.is_cap).float().mean()) if m.any() else 0.0,
        "clipped_share": float(moved[m].float().mean()) if m.any() else 0.0,
        "logprob_mismatch_max": float((logp.detach() - batch.behaviour)[m].abs().max()) if m.any() else 0.0,
        "tokens": batch.n_tokens,
        "distill_kl_sum": float(distill_kl),  # summed over hinted output tokens
        "distill_tokens": int(batch.distill_mask.sum()) if batch.distill_mask is not None else 0,
    }
    return loss, metrics
