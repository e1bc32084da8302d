"""Make the base model here: a byte-level BPE tokenizer and a tiny Qwen3-MoE mid-trained on the task corpus.

`flywheel model bootstrap --preset test|demo` writes a Hugging Face checkpoint directory (config.json,
model.safetensors in bf16, tokenizer.json and friends) that SGLang and transformers both load. The same
preset and seed give the same bytes; results are cached under $FLYWHEEL_HOME/models by preset, seed
and a digest of the code and settings that produced them.

The corpus holds code documents and agent turns (online_rl.tasks.agent_episodes); the report gives held-out
pass rates of the code and the rate of well-formed tool calls in held-out agent episodes.

Why one file: every line that turns a seed into the checkpoint's bytes is hashed into the cache key
(`cache_key`, with model.py, model_config.py, tasks.py and agent_episodes.py); one more file would be one more to hash.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import json
import os
import platform
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from contracts import tool_format as TF
from infra.paths import REPO_ROOT
from online_rl.model.transformer import ModelConfig
from online_rl.tasks import synthetic as T

CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
REPORT_FILE = "bootstrap_report.json"  # timings and pass rates: not part of the deterministic bytes
# Tokens of their own, as in Qwen's vocabulary, and plain text (not special: decoding keeps them, so the
# gateway reads the calls out of SGLang's text); spelled out they would cost five tokens each.
TOOL_MARKERS = [TF.CALL_OPEN, TF.CALL_CLOSE, TF.RESPONSE_OPEN, TF.RESPONSE_CLOSE, TF.ANSWER]


@dataclass
class TrainConfig:
    steps: int = 300
    batch_size: int = 8
    # An agent turn's document is up to ~220 tokens (agent_episodes); the model should have seen every
    # position a served agent prompt reaches. 256 x 8 trains as many tokens per step as 128 x 16 did.
    seq_len: int = 256
    # Documents longer than seq_len (an agent turn after a client's long system prompt) are trained whole,
    # one per step, every long_every-th step: the model sees the positions and distances a client's prompt
    # reaches at serving (0: never).
    long_every: int = 4
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    aux_loss_coef: float = 0.01
    grad_clip: float = 1.0
    threads: int = 2  # fixed so that the same seed gives the same bytes on any machine


@dataclass
class EvalConfig:
    tasks: int = 64  # held-out tasks evaluated (all of them when larger than the split)
    samples: int = 4  # samples per task at temperature 1
    max_new_tokens: int = 40
    agent_tasks: int = 8  # held-out tasks whose agent episodes are sampled (three call turns each)
    agent_samples: int = 4  # samples per call turn at temperature 1
    agent_max_new_tokens: int = 96  # the longest well-formed call (write_file) is ~65 tokens
    # Client-style turns (a client's shell, inside its context of up to corpus.context_chars): fewer, they
    # are long to generate without a KV cache
    client_tasks: int = 4
    client_samples: int = 2
    client_max_new_tokens: int = 128  # a heredoc write through a shell is ~90 tokens


# Agent clients send tens of thousands of tokens (Codex's system prompt alone is ~11k of this tokenizer's):
# positions for 40k, as Qwen3's own config has, and RoPE's base as Qwen3's (1e6), whose slow dimensions
# barely turn within a training window, so far keys are read by what they say more than by where they are.
LONG_CONTEXT = {"max_position_embeddings": 40960, "rope_theta": 1_000_000.0}


@dataclass
class BootstrapConfig:
    preset: str = "test"
    seed: int = 0
    vocab_size: int = 768  # 384 spelled an agent turn in up to ~350 tokens; 768 in up to ~216
    corpus: T.CorpusConfig = field(default_factory=lambda: T.CorpusConfig(documents=6000))
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            **LONG_CONTEXT,
        )
    )
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


PRESETS: dict[str, BootstrapConfig] = {
    # Seconds on 2 cores: enough to load and serve, and to make mostly well-formed code. No hinted documents:
    # this model (222k parameters) did not learn to use hints (the reference body came out 0.54 nats less
    # likely with one), and their share of the corpus cost its greedy tool calls (83% valid instead of 100%).
    "test": BootstrapConfig(
        corpus=T.CorpusConfig(documents=6000, hint_share=0.0, agent_share=0.15),
        train=TrainConfig(steps=800),  # measured: 300 steps left it at 2% greedy pass rate, 800 at 78%
    ),
    # The real agent clients' tests (Codex CLI, Claude Code): the demo's architecture, fewer documents, a
    # quarter of them agent turns, three in four of those through a client's shell, in contexts as long as
    # Codex's (~24k characters). The test model (222k parameters) picks a client's shell in none of its turns.
    "agent": BootstrapConfig(
        preset="agent",
        corpus=T.CorpusConfig(
            documents=12_000, hint_share=0.0, agent_share=0.25, client_share=0.75, context_chars=24_000
        ),
        model=ModelConfig(
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            **LONG_CONTEXT,
        ),
        train=TrainConfig(steps=2000, lr=2e-3, warmup_steps=100),
        eval=EvalConfig(tasks=32, samples=2, agent_tasks=8, agent_samples=2, client_tasks=8, client_samples=2),
    ),
    # Minutes on 2 cores: about half of temperature-1 samples pass held-out tests, which leaves RL room.
    "demo": BootstrapConfig(
        preset="demo",
        vocab_size=768,
        corpus=T.CorpusConfig(documents=40_000, agent_share=0.15),
        model=ModelConfig(
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            **LONG_CONTEXT,
        ),
        train=TrainConfig(steps=2400, batch_size=8, seq_len=256, lr=2e-3, warmup_steps=100),
        eval=EvalConfig(tasks=176, samples=8, agent_tasks=48, agent_samples=4),
    ),
}


def preset(name: str, seed: int = 0) -> BootstrapConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    cfg = copy.deepcopy(PRESETS[name])
    cfg.seed = cfg.corpus.seed = seed
    return cfg


# The code that turns a preset into bytes (the corpus, the tokenizer, the model, the tool format).
MODEL_CODE = (
    "online_rl/model/bootstrap.py",
    "online_rl/model/transformer.py",
    "online_rl/model/config.py",
    "online_rl/tasks/synthetic.py",
    "online_rl/tasks/agent_episodes.py",
    "online_rl/tasks/agent_clients.py",
    "contracts/tool_format.py",
)


class _NoImports(ast.NodeTransformer):
    def visit_Import(self, node: ast.AST) -> None:
        return None

    visit_ImportFrom = visit_Import


def _code_digest(source: str) -> str:
    """The program a source file holds, without its layout, comments or docstrings: reformatting or
    rewording a file keeps the key, so a formatter run never rebuilds a model that would come out the same.
    Imports are left out too: a module moved to another package (or imported by another name) keeps it."""
    tree = _NoImports().visit(ast.parse(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def cache_key(cfg: BootstrapConfig) -> str:
    """Digest of the settings and of the code that turns them into bytes."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    h.update(platform.python_version().encode())  # the corpus's prose is this Python's docstrings (agent_clients)
    for rel in MODEL_CODE:
        h.update(_code_digest((REPO_ROOT / rel).read_text()).encode())
    return h.hexdigest()[:16]


def cached_dir(cfg: BootstrapConfig) -> Path:
    from infra.paths import flywheel_home

    return flywheel_home() / "models" / f"{cfg.preset}-seed{cfg.seed}-{cache_key(cfg)}"


# --------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # A newline is always a token of its own: a prompt that ends at a line break (the IDE's cursor at
    # the start of a line) then tokenizes exactly like the same text inside a training document.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=T.SPECIAL_TOKENS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    plain = [_strip_special(d) for d in docs]
    tok.train_from_iterator(plain, trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in TOOL_MARKERS])
    # Every document in the packed training stream follows an <|endoftext|>; the served prompt starts
    # with one too (BOS = EOS, GPT-2 style), so position 0 looks the same in training and serving.
    eos_id = tok.token_to_id(T.EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{T.EOS} $A", pair=f"{T.EOS} $A {T.EOS} $B", special_tokens=[(T.EOS, eos_id)]
    )
    return tok


def _strip_special(doc: str) -> str:
    for s in T.SPECIAL_TOKENS + TOOL_MARKERS:
        doc = doc.replace(s, "\n")
    return doc


def save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    eos = T.EOS
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": eos,
                "pad_token": eos,
                "bos_token": eos,
                "unk_token": None,
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
                "additional_special_tokens": T.SPECIAL_TOKENS[1:],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"eos_token": eos, "pad_token": eos, "bos_token": eos, "additional_special_tokens": T.SPECIAL_TOKENS[1:]},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


# ---------------------------------------------------------------------------------------------- training


def packed_stream(tok, docs: list[str], seq_len: int | None = None):
    """The training stream (EOS, then every document) and per token whether it is a target: all are,
    except the newline after a call inside an agent document's history (agent_episodes.history_breaks) and
    a client's system prompt (prose to read past, not to write). Documents longer than `seq_len` tokens (an
    agent turn inside a long client context) are kept out of the stream, whole: ([(ids, learn)] each, EOS
    first), for training steps of their own; a window of the stream would cut their context off."""
    from online_rl.tasks.agent_episodes import history_breaks, system_spans

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


# -------------------------------------------------------------------------------------------- evaluation


def evaluate(model, tok, cfg: BootstrapConfig, progress: bool = True) -> dict:
    """Pass rate on held-out tasks (never in the corpus): greedy, and per sample at temperature 1."""
    import torch

    from infra.progress import bar as progress_bar
    from online_rl.sandbox import judge as sandbox

    held = T.tasks("heldout", cfg.seed, cfg.corpus.heldout_share)
    held = random.Random(cfg.seed).sample(held, min(cfg.eval.tasks, len(held)))
    gen = torch.Generator().manual_seed(cfg.seed)
    stop = {tok.token_to_id(s) for s in T.SPECIAL_TOKENS}
    by_len: dict[int, list] = {}
    for task in held:
        ids = tok.encode(task.prompt).ids  # with the leading <|endoftext|>, as the server tokenizes
        by_len.setdefault(len(ids), []).append((task, ids))
    greedy, sampled = [], []
    bar = progress_bar(total=len(held), desc="eval held-out", unit="task", enabled=progress)
    for group in by_len.values():
        tasks_, prompts = [t for t, _ in group], [p for _, p in group]
        for task, g in zip(tasks_, model.generate(prompts, cfg.eval.max_new_tokens, 0.0, stop)):
            greedy.append(sandbox.candidate_for(task, tok.decode(g)))
        many = [p for p in prompts for _ in range(cfg.eval.samples)]
        outs = model.generate(many, cfg.eval.max_new_tokens, 1.0, stop, generator=gen)
        for i, s in enumerate(outs):
            sampled.append(sandbox.candidate_for(tasks_[i // cfg.eval.samples], tok.decode(s)))
        bar.update(len(group))
    bar.close()
    vg, vs = sandbox.run(greedy), sandbox.run(sampled)
    hinted = sandbox.run(_hinted_samples(model, tok, cfg, held, stop))
    return {
        "heldout_tasks": len(held),
        "samples_per_task": cfg.eval.samples,
        "pass_rate_greedy": round(sum(v.ok for v in vg) / len(vg), 4),
        "pass_rate_t1": round(sum(v.ok for v in vs) / len(vs), 4),
        # The same tasks with a user's hint before the body (the teacher of text-feedback distillation):
        # it must beat pass_rate_t1 for the teacher to have anything to teach.
        "pass_rate_t1_hinted": round(sum(v.ok for v in hinted) / len(hinted), 4),
        "example": greedy[0].code,
        **evaluate_agent(model, tok, cfg, held, progress),
    }


def _hinted_samples(model, tok, cfg: BootstrapConfig, held: list, stop: set) -> list:
    """Temperature-1 samples of held-out tasks whose prompt ends in a hint about one of the task's wrong
    bodies (as the population writes them), one sandbox candidate each."""
    import torch

    from online_rl.sandbox import judge as sandbox

    rng = random.Random(cfg.seed + 2)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    by_len: dict[int, list] = {}
    for task in held:
        text = task.prompt + T.hint_line(T.hint_for(task, rng.choice(task.wrong_bodies())))
        ids = tok.encode(text).ids
        by_len.setdefault(len(ids), []).append((task, ids))
    out = []
    for group in by_len.values():
        many = [ids for _, ids in group for _ in range(cfg.eval.samples)]
        for i, s in enumerate(model.generate(many, cfg.eval.max_new_tokens, 1.0, stop, generator=gen)):
            out.append(sandbox.candidate_for(group[i // cfg.eval.samples][0], tok.decode(s)))
    return out


def evaluate_agent(model, tok, cfg: BootstrapConfig, held: list, progress: bool = True) -> dict:
    """Tool calls on held-out tasks' agent episodes: of the turns that should call a tool (read, write,
    run the tests), the share whose answer is a well-formed call to a known tool with valid arguments,
    judged by serving's rules (agent_episodes.call_outcome). Greedy, and per sample at temperature 1."""

    from online_rl.tasks import agent_clients as C, agent_episodes as A

    rng = random.Random(cfg.seed)
    turns = []
    for task in held[: cfg.eval.agent_tasks]:
        _, ts = A.episode(task, task.reference, rng.choice(A.PATHS), rng.choice(A.ASKS))
        turns += [t for t in ts if t.call is not None]
    client_turns = []
    for task in held[: cfg.eval.client_tasks]:
        shell = C.client_shell(rng)
        context = C.client_context(rng, shell.style, cfg.corpus.context_chars)
        _, ts = A.episode(task, task.reference, rng.choice(A.PATHS), rng.choice(A.SHELL_ASKS), shell, context, rng)
        client_turns += [t for t in ts if t.call is not None]
    out = _agent_rates(model, tok, turns, cfg.eval.agent_samples, cfg.eval.agent_max_new_tokens, cfg.seed + 1, progress)
    client = _agent_rates(
        model, tok, client_turns, cfg.eval.client_samples, cfg.eval.client_max_new_tokens, cfg.seed + 3, progress
    )
    out.update({f"client_{k}": v for k, v in client.items() if not k.startswith("agent_example")})
    out["client_context_chars_max"] = max((t.context_chars for t in client_turns), default=0)
    return out


def _agent_rates(model, tok, turns: list, n: int, max_new: int, seed: int, progress: bool) -> dict:
    """Of these call turns, the share sampled (greedy, and n each at temperature 1) that is a well-formed
    call to one of the turn's tools (valid), and the one the episode needs (expected)."""
    import torch

    from infra.progress import bar as progress_bar
    from online_rl.tasks import agent_episodes as A

    gen = torch.Generator().manual_seed(seed)
    stop = {tok.token_to_id(s) for s in T.SPECIAL_TOKENS}
    by_len: dict[int, list] = {}
    for t in turns:
        ids = tok.encode(t.prompt).ids  # with the leading <|endoftext|>, as the server tokenizes
        by_len.setdefault(len(ids), []).append((t, ids))
    outcomes: dict[str, list] = {"greedy": [], "t1": []}
    bar = progress_bar(total=len(turns), desc="eval agent turns", unit="turn", enabled=progress)
    for length in sorted(by_len):
        group = by_len[length]
        prompts = [p for _, p in group]
        for (t, _), g in zip(group, model.generate(prompts, max_new, 0.0, stop)):
            outcomes["greedy"].append((t, tok.decode(g)))
        outs = model.generate([p for p in prompts for _ in range(n)], max_new, 1.0, stop, generator=gen)
        outcomes["t1"] += [(group[i // n][0], tok.decode(s)) for i, s in enumerate(outs)]
        bar.update(len(group))
    bar.close()

    def rates(pairs):
        kinds = [A.call_outcome(text, t.tools) for t, text in pairs]
        expected = [k == "valid" and A.call_matches(t, text) for (t, text), k in zip(pairs, kinds)]
        return kinds, round(kinds.count("valid") / max(1, len(kinds)), 4), round(sum(expected) / max(1, len(kinds)), 4)

    kinds, valid_t1, expected_t1 = rates(outcomes["t1"])
    _, valid_greedy, expected_greedy = rates(outcomes["greedy"])
    worst = next((text for (_, text), k in zip(outcomes["t1"], kinds) if k != "valid"), None)
    return {
        "agent_turns": len(turns),
        "agent_samples_per_turn": n,
        "tool_call_valid_rate": valid_t1,
        "tool_call_valid_rate_greedy": valid_greedy,
        "tool_call_expected_rate": expected_t1,
        "tool_call_expected_rate_greedy": expected_greedy,
        "tool_call_outcomes_t1": {k: kinds.count(k) for k in ("valid", "malformed", "unknown_tool", "none")},
        "agent_example": outcomes["greedy"][0][1] if outcomes["greedy"] else None,
        "agent_example_not_valid": worst,
    }


# ------------------------------------------------------------------------------------------------- build


def build(cfg: BootstrapConfig, out: Path, progress: bool = True, evaluate_model: bool = True) -> dict:
    """Build the checkpoint into `out` (a fresh directory); returns the report."""
    import torch

    from online_rl.model.transformer import save_pretrained

    torch.set_num_threads(cfg.train.threads)
    torch.use_deterministic_algorithms(True)
    timings = {}
    t0 = time.monotonic()
    key = cache_key(cfg)
    docs = T.corpus(cfg.corpus)
    tok = train_tokenizer(docs, cfg.vocab_size)
    eos_id = tok.token_to_id(T.EOS)
    # The trained vocabulary decides the embedding size; the caller's config stays as given.
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, vocab_size=tok.get_vocab_size(), eos_token_id=eos_id, bos_token_id=eos_id),
    )
    ids, learn, long_docs = packed_stream(tok, docs, cfg.train.seq_len)
    timings["corpus_and_tokenizer_s"] = round(time.monotonic() - t0, 2)

    t1 = time.monotonic()
    model, losses = train_model(cfg, ids, learn, progress, long_docs)
    timings["train_s"] = round(time.monotonic() - t1, 2)

    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(model, out, torch.bfloat16)
    save_tokenizer(tok, out, cfg.model.max_position_embeddings)
    (out / "generation_config.json").write_text(
        json.dumps(
            {"eos_token_id": cfg.model.eos_token_id, "pad_token_id": cfg.model.eos_token_id, "do_sample": False},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )

    report = {
        "preset": cfg.preset,
        "seed": cfg.seed,
        "cache_key": key,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_documents": len(docs),
        "corpus_tokens": len(ids),
        "vocab_size": cfg.model.vocab_size,
        "train_steps": cfg.train.steps,
        "tokens_trained": cfg.train.steps * cfg.train.batch_size * cfg.train.seq_len,
        "long_documents": len(long_docs),
        "long_document_tokens_max": max((len(d[0]) for d in long_docs), default=0),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "timings": timings,
    }
    if evaluate_model:
        from online_rl.model.transformer import load_pretrained

        t2 = time.monotonic()
        served = load_pretrained(out, torch.float32)  # the bf16 weights serving will see
        report["eval"] = evaluate(served, tok, cfg, progress)
        timings["eval_s"] = round(time.monotonic() - t2, 2)
    timings["total_s"] = round(time.monotonic() - t0, 2)
    report["loss_curve"] = [round(x, 4) for x in losses[:: max(1, len(losses) // 200)]]
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    _plot_loss(losses, out / "bootstrap_loss.png", cfg.preset)
    return report


def _plot_loss(losses: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(f"bootstrap mid-training ({title})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bootstrap(
    preset_name: str = "test", seed: int = 0, out: Path | None = None, progress: bool = True, force: bool = False
) -> Path:
    """The checkpoint for a preset and seed: from the cache, or built once and cached. Returns its dir."""
    cfg = preset(preset_name, seed)
    cache = cached_dir(cfg)
    if force or not (cache / ".complete").exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
        try:
            build(cfg, staging, progress)
            (staging / ".complete").write_text("ok\n")
            if cache.exists():
                shutil.rmtree(cache)
            os.replace(staging, cache)  # atomic: a half-built model is never visible
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for stale in cache.parent.glob(f"{cfg.preset}-seed{cfg.seed}-*"):  # built by older code or settings
            if stale != cache and (stale / ".complete").exists():
                shutil.rmtree(stale, ignore_errors=True)
    if out is None or Path(out).resolve() == cache.resolve():
        return cache
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in (*CHECKPOINT_FILES, REPORT_FILE, "bootstrap_loss.png"):
        shutil.copy2(cache / name, out / name)
    return out


def report(path: Path) -> dict:
    return json.loads((Path(path) / REPORT_FILE).read_text())
