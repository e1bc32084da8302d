"""On-policy distillation's data: for a completion a user commented on, fresh completions of the same served
context by the model as it is now (the student), each carrying the comment's hint for the teacher.

A comment is worth more than the one completion it was about. That completion alone gives the distillation KL
(online_rl.trainer.loss) one trajectory of the student, and an old one (the version that served it); sampling the
student again on the context gives the teacher's per-token correction on where the student goes now, which
is what on-policy distillation learns from (the student's own samples, scored densely by the teacher). These
samples carry no reward: their advantage is 0 (online_rl.trainer.loss.advantages), so only the distillation term and
the KL to the reference train on them; the loss averages over every sequence of the batch, these included
(each weighs as a served one). Their routing is the trainer's own (as serving would log it: the routes of
every input position), so router replay scores the routes that made them, as for served samples. They carry
the commented sample's tenant and time: the trainer counts them in its tenant's provenance, and a waiting
context goes when its tenant's policy refuses it (online_rl.data.tenants).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch

from online_rl.config import LossConfig
from online_rl.data.samples import DISTILL, Sample
from online_rl.model.transformer import MoECoder, token_logprobs


def student_samples(
    model: MoECoder,
    commented: Sample,
    n: int,
    max_tokens: int,
    stop_ids: set[int],
    generator: torch.Generator,
    version: int,
) -> list[Sample]:
    """n temperature-1 completions of commented's prompt by model, as samples with its hint (none: no hint,
    n = 0, or a prompt that leaves no room in the model's context). An empty completion is left out (nothing
    to distill on). Completions stop where the context ends, so that the scoring forward sees every token."""
    max_tokens = min(max_tokens, model.cfg.max_position_embeddings - commented.prompt_ids.size)
    if n <= 0 or max_tokens < 1 or commented.hint_ids is None or commented.hint_ids.size == 0:
        return []
    prompt = [int(t) for t in commented.prompt_ids]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            samples = []
            for i, out in enumerate(o for o in _sample(model, prompt, n, max_tokens, stop_ids, generator) if o):
                seq = torch.tensor([prompt + out], device=_device(model))  # (1, P + N)
                r = model(seq[:, :-1])  # the routes of every input position, as serving logs them
                lp = token_logprobs(r.logits, seq[:, 1:])[0, len(prompt) - 1 :]  # (N,)
                samples.append(
                    Sample(
                        key=f"{commented.key}/{DISTILL}{i}",
                        prompt_ids=commented.prompt_ids,
                        output_ids=np.asarray(out, np.int32),
                        behaviour_logprobs=lp.float().cpu().numpy().astype(np.float32),
                        routed_experts=r.experts[0].cpu().numpy().astype(np.uint8),
                        reward=0.0,
                        model_version=version,
                        source=DISTILL,
                        hint_ids=commented.hint_ids,
                        tenant=commented.tenant,  # its tenant's data: provenance (online_rl.data.tenants)
                        ts=commented.ts,
                    )
                )
    finally:
        model.train(was_training)
    return samples


def _device(model: MoECoder) -> torch.device:
    return next(model.parameters()).device


def _sample(
    model: MoECoder, prompt: list[int], n: int, max_tokens: int, stop_ids: set[int], generator: torch.Generator
) -> list[list[int]]:
    """n temperature-1 continuations of one prompt, each cut before its first stop id (the prompt and them fit
    the context). MoECoder.generate draws on the CPU only; here the model may be on a GPU, and the draws are
    on the CPU, from `generator` (one stream of draws whatever the device). No KV cache, as generate: the
    contexts and completions of these models are short."""
    idx = torch.tensor([prompt] * n, device=_device(model))  # (n, P)
    done = torch.zeros(n, dtype=torch.bool)
    stops = torch.tensor(sorted(stop_ids) or [-1], dtype=torch.long)  # -1: no token, none stops
    for _ in range(max_tokens):
        probs = torch.softmax(model(idx).logits[:, -1].float(), -1).cpu()  # (n, V)
        nxt = torch.where(done, stops[0], torch.multinomial(probs, 1, generator=generator)[:, 0])  # (n,)
        idx = torch.cat([idx, nxt[:, None].to(idx.device)], dim=1)
        done |= torch.isin(nxt, stops)
        if done.all():
            break
    outs = []
    for row in idx[:, len(prompt) :].tolist():
        outs.append(row[: next((i for i, t in enumerate(row) if t in stop_ids), len(row))])
    return outs


def sample_commented(
    model: MoECoder,
    batch: list[Sample],
    waiting: list[tuple[Sample, int]],
    cfg: LossConfig,
    stop_ids: set[int],
    generator: torch.Generator,
    version: int,
    failed: Callable[[Exception], object],
) -> tuple[list[Sample], list[tuple[Sample, int]], int]:
    """Fresh samples of the commented contexts in this batch, then of those waiting from earlier updates (with
    the updates each has left), at most cfg.distill_contexts of them. Returns the samples, the contexts that
    wait now (at most cfg.distill_backlog: beyond, those already sampled, at the end, are dropped) and how
    many were dropped. A context whose sampling fails (failed(e)) counts as sampled: none is retried for ever."""
    queue = [(_context(s), cfg.distill_updates) for s in batch if s.hint_ids is not None and s.hint_ids.size]
    queue += waiting
    now, rest = queue[: cfg.distill_contexts], queue[cfg.distill_contexts :]
    fresh = []
    for s, left in now:
        try:
            fresh += student_samples(
                model, s, cfg.distill_samples, cfg.distill_max_tokens, stop_ids, generator, version
            )
        except Exception as e:  # memory, a device: this context's samples, this update
            failed(e)
        if left > 1:
            rest.append((s, left - 1))
    dropped = max(0, len(rest) - cfg.distill_backlog)
    return fresh, rest[: cfg.distill_backlog], dropped


def _context(s: Sample) -> Sample:
    """What sampling a commented context again needs (its key, prompt and hint): the served completion, its
    logprobs and routes would only weigh on memory and checkpoints while it waits."""
    return dataclasses.replace(
        s,
        output_ids=np.zeros(0, np.int32),
        behaviour_logprobs=np.zeros(0, np.float32),
        routed_experts=np.zeros((0, 0, 0), np.uint8),
    )
