"""The bootstrap corpus: documents made from the train split's tasks (online_rl.tasks.synthetic), each ending
in EOS, deterministic for a seed. A share of the bodies is deliberately wrong, a share of the documents are test
functions or fill-in-the-middle, a share are multi-line tasks (online_rl.tasks.multiline), a share are hinted
(`# hint: ...` before the reference body: the model learns to follow a user's hint, which text-feedback
distillation's teacher relies on, online_rl.trainer.loss), and a share are turns of agent episodes (read the
file, write a body, run the tests, answer: online_rl.tasks.agent_episodes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from online_rl.tasks import agent_episodes
from online_rl.tasks.synthetic import EOS, Task, fim_prompt, hint_for, hint_line, tasks


@dataclass
class CorpusConfig:
    seed: int = 0
    documents: int = 20_000
    correct_share: float = 0.5  # the rest get one of the family's plausible wrong bodies
    test_doc_share: float = 0.15  # documents that are a test function instead
    fim_share: float = 0.1  # documents in fill-in-the-middle form
    heldout_share: float = 0.2
    # Documents that are one assistant turn of a tool-using episode (agent_episodes). Such a document is
    # ~4x as long as a code one (~150 vs ~37 tokens), so 10% of documents are ~30% of the tokens.
    agent_share: float = 0.1
    # Of the agent turns that call a tool, a deliberately imperfect call (broken JSON, a missing required
    # argument, an unknown tool): the base model then makes malformed calls sometimes, as it writes wrong
    # code part of the time, and RL has something to fix. The model under-samples this rare branch: with
    # 0.1 the demo model's temperature-1 calls were 4.2% invalid (0% greedy); 0.2 aims at about 10%.
    malformed_call_share: float = 0.2
    # Documents whose body follows a hint (hint_for on one of the task's wrong bodies): the model learns to
    # use a user's hint, which text-feedback distillation's teacher relies on (online_rl.trainer.loss).
    hint_share: float = 0.1
    # Code documents drawn from the multi-line families (online_rl.tasks.multiline) instead: bodies of several
    # lines with one wrong line, where a hint names the line (0: the one-line families only).
    multiline_share: float = 0.0
    # Of the agent turns: through a client's shell (Codex's exec_command, Claude Code's Bash, variants) rather
    # than Flywheel's three tools; of those, inside a client's context (a system prompt of up to context_chars
    # characters, an environment block, reminders) that the model must read past (online_rl.tasks.agent_clients).
    client_share: float = 0.5
    context_share: float = 0.7
    context_chars: int = 8000


def corpus(cfg: CorpusConfig) -> list[str]:
    """The bootstrap corpus: documents (each ending in EOS), deterministic for a seed."""
    rng = random.Random(cfg.seed)
    train = tasks("train", cfg.seed, cfg.heldout_share)
    train_multiline = tasks("train", cfg.seed, cfg.heldout_share, families="multiline")
    docs = []
    for _ in range(cfg.documents):
        t = rng.choice(train)
        t = Task(t.family, t.k, t.arg, rng.randrange(len(t.spec.docs)))
        if cfg.agent_share and rng.random() < cfg.agent_share:
            turn = agent_episodes.sample_turn(
                t,
                rng,
                cfg.correct_share,
                cfg.malformed_call_share,
                cfg.client_share,
                cfg.context_share,
                cfg.context_chars,
            )
            docs.append(turn.document)
            continue
        if cfg.multiline_share and rng.random() < cfg.multiline_share:  # no draw at 0: other presets' bytes stay
            t = rng.choice(train_multiline)
            t = Task(t.family, t.k, t.arg, rng.randrange(len(t.spec.docs)))
        if cfg.hint_share and rng.random() < cfg.hint_share:
            docs.append(t.prompt + hint_line(hint_for(t, rng.choice(t.wrong_bodies()))) + t.reference + EOS)
            continue
        body = t.reference if rng.random() < cfg.correct_share else rng.choice(t.wrong_bodies())
        r = rng.random()
        if r < cfg.test_doc_share:
            docs.append(t.test_source() + EOS)
        elif r < cfg.test_doc_share + cfg.fim_share:
            suffix = "\n\n" + t.test_source() if rng.random() < 0.5 else ""
            docs.append(fim_prompt(t.prompt, suffix) + body + EOS)
        else:
            docs.append(t.prompt + body + EOS)
    return docs
