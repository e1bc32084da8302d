"""Completions and their events made with the trainer's own model, shaped as serving logs them: for tests,
benchmarks and rehearsals of the trainer without a fleet."""

from __future__ import annotations

import numpy as np
import torch

from contracts import events as ev
from infra import kafka_auth
from online_rl.model.transformer import MoECoder, token_logprobs
from online_rl.tasks import synthetic as tasks


def sample_completions(
    model: MoECoder, tok, task_list, per_task: int, generator: torch.Generator, max_tokens: int = 24
) -> list[tuple[list[int], list[int], np.ndarray, np.ndarray]]:
    """(prompt ids, output ids, behaviour logprobs, routed experts) per sample, at temperature 1."""
    out = []
    model.eval()
    for t in task_list:
        ids = tok.encode(t.prompt).ids
        for o in model.generate([ids] * per_task, max_tokens, 1.0, {0, 1, 2, 3}, generator=generator):
            if not o:
                continue
            seq = torch.tensor([ids + o])
            with torch.no_grad():
                r = model(seq[:, :-1])
            lp = token_logprobs(r.logits, seq[:, 1:])[0, len(ids) - 1 :].numpy().astype(np.float32)
            out.append((ids, o, lp, r.experts[0].numpy().astype(np.uint8)))
    model.train()
    return out


def serve(
    model: MoECoder, tok, prompts: list[str], generator: torch.Generator, max_tokens: int = 40, temperature: float = 1.0
) -> list[tuple[list[int], list[int], np.ndarray, np.ndarray]]:
    """One completion per prompt (prompts of any lengths, batched by length), in prompt order, with what
    serving logs: (prompt ids, output ids, behaviour logprobs, routed experts). An empty output is kept."""
    stop = {tok.token_to_id(s) for s in tasks.SPECIAL_TOKENS}
    encoded = [tok.encode(p).ids for p in prompts]
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    outs: list[list[int]] = [[] for _ in prompts]
    model.eval()
    with torch.no_grad():
        for idx in by_len.values():
            for i, o in zip(idx, model.generate([encoded[i] for i in idx], max_tokens, temperature, stop, generator)):
                outs[i] = o
        result = []
        for ids, o in zip(encoded, outs):
            seq = torch.tensor([ids + o])
            r = model(seq[:, :-1])  # (P + N - 1) positions: the routes of every input token, as serving logs them
            lp = token_logprobs(r.logits, seq[:, 1:])[0, len(ids) - 1 :].numpy().astype(np.float32)
            result.append((ids, o, lp, r.experts[0].numpy().astype(np.uint8)))
    model.train()
    return result


def as_samples(raw, reward, group_size: int | None = None) -> list:
    """sample_completions' tuples as the trainer's samples of version 0: the i-th rewarded reward(i), in
    groups of group_size consecutive samples (None: user samples, no group)."""
    from online_rl.data.samples import Sample

    return [
        Sample(
            key=str(i),
            prompt_ids=np.asarray(p),
            output_ids=np.asarray(o),
            behaviour_logprobs=lp,
            routed_experts=e,
            reward=float(reward(i)),
            model_version=0,
            group=None if group_size is None else str(i // group_size),
        )
        for i, (p, o, lp, e) in enumerate(raw)
    ]


def events_for(samples, judge, version: int = 0, prefix: str = "cmpl") -> list[tuple[str, str, bytes]]:
    """(topic, key, value) for a completion and its feedback per sample; judge(output ids) -> kind."""
    records = []
    for i, (ids, o, lp, experts) in enumerate(samples):
        cid = f"{prefix}-{i}"
        c = ev.CompletionEvent(
            completion_id=cid,
            choice_index=0,
            tenant="t",
            model_version=version,
            prompt_ids=np.asarray(ids, np.int32),
            output_ids=np.asarray(o, np.int32),
            logprobs=lp,
            routed_experts=experts,
            sampling={"temperature": 1.0},
            finish_reason="stop",
            latency={},
        )
        f = ev.FeedbackEvent(completion_id=cid, choice_index=0, tenant="t", kind=judge(o))
        records += [(ev.TOPIC_COMPLETIONS, cid, c.encode()), (ev.TOPIC_FEEDBACK, cid, f.encode())]
    return records


def produce(bootstrap: str, records) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
    )
    try:
        for topic, key, value in records:
            p.send(topic, key=key.encode(), value=value)
        p.flush(timeout=60)
    finally:
        p.close()


def heldout_split(n_train: int = 60, n_eval: int = 60):
    held = tasks.tasks("heldout")
    return held[:n_train], held[n_train : n_train + n_eval]
