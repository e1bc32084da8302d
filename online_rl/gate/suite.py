"""The eval gate's held-out suite: one checkpoint's outcomes on held-out tasks (never in the base corpus), item by
item, so that two versions can be compared with a test (online_rl.gate.verdict).

    pass_at_1             per temperature-1 completion of a held-out task: passes its hidden tests (in the sandbox)
    session_success       per agent session (a held-out task's episode: read, write, run the tests) and sample:
                          each of its three call turns answered with the call it needs (tool and file)
    valid_tool_call_rate  per sampled call turn: a well-formed call to an offered tool with valid arguments
    answer_tokens         per completion: its length in tokens
    empty_or_refusal      per answer (completions and call turns): nothing but whitespace, or a refusal

Both versions run the same tasks with the same sampling seed, so one version published twice gets the same
outcomes. The model runs in this process (the trainer's implementation, CPU or GPU), beside no serving replica.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from infra.config import option
from online_rl.tasks import synthetic as T

REFUSALS = ("i can't", "i cannot", "i'm sorry", "i am sorry", "as an ai")  # an answer that begins so is a refusal
METRIC_NAMES = ("pass_at_1", "session_success", "valid_tool_call_rate", "answer_tokens", "empty_or_refusal")


@dataclass
class SuiteConfig:
    tasks: int = option(32, help="held-out autocomplete tasks in the gate's suite")
    sessions: int = option(8, help="held-out agent sessions in the gate's suite (three call turns each)")
    samples: int = option(4, help="temperature-1 samples per task and per call turn")
    seed: int = option(0, help="the held-out split's seed and the suite's sampling seed (both versions alike)")
    heldout_share: float = 0.2  # the split the base model was built with (online_rl.tasks.corpus.CorpusConfig)
    max_new_tokens: int = 40
    agent_max_new_tokens: int = 96  # the longest well-formed call (write_file) is ~65 tokens

    def __post_init__(self):
        if min(self.tasks, self.sessions, self.samples) < 1:
            raise ValueError(f"a suite needs at least one task, session and sample (got {self})")


def empty_or_refusal(text: str) -> bool:
    s = text.strip().lower()
    return not s or s.startswith(REFUSALS)


def _sample(model, tok, prompts: list[str], n: int, max_new: int, seed: int) -> list[list[tuple[str, int]]]:
    """n temperature-1 completions of each prompt (text, tokens), batched by prompt length, seeded."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    stop = {tok.token_to_id(s) for s in T.SPECIAL_TOKENS}
    by_len: dict[int, list[int]] = {}
    ids = [tok.encode(p).ids for p in prompts]  # with the leading <|endoftext|>, as the server tokenizes
    for i, p in enumerate(ids):
        by_len.setdefault(len(p), []).append(i)
    out: list[list[tuple[str, int]]] = [[] for _ in prompts]
    with torch.no_grad():
        for length in sorted(by_len):
            group = by_len[length]
            many = [ids[i] for i in group for _ in range(n)]
            for j, g in enumerate(model.generate(many, max_new, 1.0, stop, generator=gen)):
                out[group[j // n]].append((tok.decode(g), len(g)))
    return out


def run(checkpoint: Path, cfg: SuiteConfig) -> dict[str, list]:
    """The outcomes of the checkpoint's model on the suite, by metric name (METRIC_NAMES)."""
    import torch
    from tokenizers import Tokenizer

    from online_rl.model.transformer import load_pretrained
    from online_rl.sandbox import judge as sandbox
    from online_rl.tasks import agent_episodes as A

    checkpoint = Path(checkpoint)
    model = load_pretrained(checkpoint, torch.float32).eval()
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    rng = random.Random(cfg.seed)
    held = T.tasks("heldout", cfg.seed, cfg.heldout_share)
    tasks = rng.sample(held, min(cfg.tasks, len(held)))
    completions = _sample(model, tok, [t.prompt for t in tasks], cfg.samples, cfg.max_new_tokens, cfg.seed)
    flat = [(task, text, n) for task, outs in zip(tasks, completions) for text, n in outs]
    verdicts = sandbox.run([sandbox.candidate_for(task, text) for task, text, _ in flat])

    sessions = []
    for task in rng.sample(held, min(cfg.sessions, len(held))):
        _, turns = A.episode(task, task.reference, rng.choice(A.PATHS), rng.choice(A.ASKS))
        sessions.append([t for t in turns if t.call is not None])
    turns = [t for s in sessions for t in s]
    answers = _sample(model, tok, [t.prompt for t in turns], cfg.samples, cfg.agent_max_new_tokens, cfg.seed + 1)
    by_turn = {id(t): a for t, a in zip(turns, answers)}

    def expected(turn, text: str) -> bool:
        return A.call_outcome(text, turn.tools) == "valid" and A.call_matches(turn, text)

    return {
        "pass_at_1": [v.ok for v in verdicts],
        "answer_tokens": [n for _, _, n in flat],
        "valid_tool_call_rate": [A.call_outcome(text, t.tools) == "valid" for t in turns for text, _ in by_turn[id(t)]],
        "session_success": [
            all(expected(t, by_turn[id(t)][s][0]) for t in session) for session in sessions for s in range(cfg.samples)
        ],
        "empty_or_refusal": [empty_or_refusal(text) for _, text, _ in flat]
        + [empty_or_refusal(text) for t in turns for text, _ in by_turn[id(t)]],
    }
