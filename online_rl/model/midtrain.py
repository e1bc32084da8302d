"""Mid-training the base model on the corpus: documents packed into fixed-length rows (the long-context
presets also train on whole long documents), then AdamW steps with progress."""

from __future__ import annotations

import random

from online_rl.model.presets import BootstrapConfig, TrainConfig
from online_rl.tasks import synthetic as T


def packed_stream(tok, docs: list[str], seq_len: int | None = None):
    """The training stream (EOS, then every document) and per token whether it is a target: all are,
    except the newline after a call inside an agent document's history (loss_mask.history_breaks) and
    a client's system prompt (prose to read past, not to write). Documents longer than `seq_len` tokens (an
    agent turn inside a long client context) are kept out of the stream, whole: ([(ids, learn)] each, EOS
    first), for training steps of their own; a window of the stream would cut their context off."""
    from online_rl.model.loss_mask import history_breaks, system_spans

    eos_id = tok.token_to_id(T.EOS)
    ids, learn, long = [eos_id], [True], []
    for doc, enc in zip(docs, tok.encode_batch(docs, add_special_tokens=False)):
        breaks = set(history_breaks(doc))
        spans = system_spans(doc)
        mask = [start not in breaks and not any(a <= start < b for a, b in spans) for start, _ in enc.offsets]
        if seq_len is not None and len(enc.ids) >= seq_len:
            long.append(([eos_id] + enc.ids, [True] + mask))
            continue
        ids += enc.ids
        learn += mask
    return (ids, learn, long) if seq_len is not None else (ids, learn)


def _packed_batches(ids: list[int], learn: list[bool], cfg: TrainConfig, seed: int):
    """Endless (B, T+1) windows over the packed token stream and its target mask, reshuffled each epoch."""
    import torch

    n = (len(ids) - 1) // cfg.seq_len
    data = torch.tensor(ids[: n * cfg.seq_len + 1], dtype=torch.long)
    mask = torch.tensor(learn[: n * cfg.seq_len + 1], dtype=torch.bool)
    starts = list(range(0, n * cfg.seq_len, cfg.seq_len))
    rng = random.Random(seed)
    while True:
        rng.shuffle(starts)
        for i in range(0, len(starts) - cfg.batch_size + 1, cfg.batch_size):
            win = starts[i : i + cfg.batch_size]
            yield (
                torch.stack([data[s : s + cfg.seq_len + 1] for s in win]),
                torch.stack([mask[s : s + cfg.seq_len + 1] for s in win]),
            )


def _long_batches(docs: list[tuple[list[int], list[bool]]], seed: int):
    """Endless (1, T+1) sequences, one long document each, reshuffled each epoch."""
    import torch

    order = list(range(len(docs)))
    rng = random.Random(seed + 7)
    while docs:
        rng.shuffle(order)
        for i in order:
            ids, learn = docs[i]
            yield torch.tensor([ids], dtype=torch.long), torch.tensor([learn], dtype=torch.bool)


def train_model(
    cfg: BootstrapConfig,
    ids: list[int],
    learn: list[bool] | None = None,
    progress: bool = True,
    long_docs: list | None = None,
):
    import math

    import torch

    from infra.progress import bar as progress_bar
    from online_rl.model.transformer import MoECoder

    torch.manual_seed(cfg.seed)
    model = MoECoder(cfg.model)
    model.init_weights(cfg.seed)
    tc = cfg.train
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < tc.warmup_steps:
            return tc.lr * (step + 1) / tc.warmup_steps
        frac = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
        return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    batches = _packed_batches(ids, [True] * len(ids) if learn is None else learn, tc, cfg.seed)
    long = _long_batches(long_docs or [], cfg.seed)
    losses = []
    bar = progress_bar(range(tc.steps), desc=f"bootstrap {cfg.preset}", unit="step", enabled=progress)
    for step in bar:
        # Every long_every-th step is one long document whole (a turn inside a client's long context)
        xy, m = (
            next(long) if long_docs and tc.long_every and step % tc.long_every == tc.long_every - 1 else next(batches)
        )
        out = model(xy[:, :-1])
        ce = torch.nn.functional.cross_entropy(
            out.logits.reshape(-1, cfg.model.vocab_size), xy[:, 1:].reshape(-1), reduction="none"
        )
        m = m[:, 1:].reshape(-1).to(ce.dtype)
        loss = (ce * m).sum() / m.sum().clamp(min=1)
        total = loss + tc.aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
    return model, losses
