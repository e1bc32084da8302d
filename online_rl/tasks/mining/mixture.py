"""Mined tasks as rollout environments, in a configured mixture with the synthetic families.

`Mixture` holds the held-out synthetic tasks and the mined ones (read from tasks.jsonl files, `flywheel tasks mine`'s
output) and draws a step's tasks: each is mined with probability `share`. A mined task's prompt is its signature and
docstring, after as many whole lines above them as fit in `prompt_chars` characters; its completions are judged by
its hidden tests in the sandbox (online_rl.tasks.mining.judge), a synthetic task's as before
(online_rl.sandbox.judge). Either way one verdict per completion with `reward` and `ok`. Only the modes asked for
are drawn: body tasks by default (the rollouts' short completions); the agent sessions draw feature tasks too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from online_rl.sandbox import judge as sandbox
from online_rl.tasks.mining import judge as mined_judge
from online_rl.tasks.mining.candidates import source_lines
from online_rl.tasks.mining.store import FeatureTask, MinedTask, load


def task_files(path: Path) -> list[Path]:
    """tasks.jsonl itself, or every tasks.jsonl under a folder (one per mined source)."""
    return [path] if path.is_file() else sorted(path.rglob("tasks.jsonl"))


def prompt_of(task: Any, prompt_chars: int = 2000) -> str:
    """What the model is given: a synthetic task's prompt, or the end of a mined task's prefix."""
    if not isinstance(task, MinedTask):
        return task.prompt
    lines = source_lines(task.prefix)
    start = task.lineno - 1  # the def line: the signature and docstring are always kept whole
    used = sum(len(line) for line in lines[start:])
    while start > 0 and used + len(lines[start - 1]) <= prompt_chars:
        start -= 1
        used += len(lines[start])
    return "".join(lines[start:])


def judge(task: Any, completions: Sequence[str], sandbox_cfg: sandbox.SandboxConfig | None = None) -> list:
    """One verdict per completion (`reward`, `ok`), by the task's own kind of judge."""
    if isinstance(task, (MinedTask, FeatureTask)):
        return mined_judge.judge([(task, c) for c in completions])
    return sandbox.run([sandbox.candidate_for(task, c) for c in completions], sandbox_cfg)


class Mixture:
    def __init__(
        self,
        synthetic: Sequence[Any],
        mined_path: Path | None,
        share: float,
        seed: int = 0,
        modes: tuple[str, ...] = ("body",),
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"the mined share must be within [0, 1], got {share}")
        self.synthetic = list(synthetic)
        found = load(task_files(mined_path)) if mined_path is not None and share > 0 else []
        self.mined = [t for t in found if (t.mode if isinstance(t, FeatureTask) else "body") in modes]
        if share > 0 and not self.mined:
            raise FileNotFoundError(f"no mined tasks under {mined_path} (make some: flywheel tasks mine SOURCE)")
        self.share = share
        self.rng = random.Random(seed)

    def draw(self, n: int) -> list[Any]:
        """n tasks, each mined with probability `share`, without repeats within the draw where there are enough."""
        mined_n = sum(self.rng.random() < self.share for _ in range(n)) if self.mined else 0
        mined_n = min(mined_n, len(self.mined))
        syn_n = min(n - mined_n, len(self.synthetic))
        out = self.rng.sample(self.mined, mined_n) + self.rng.sample(self.synthetic, syn_n)
        self.rng.shuffle(out)
        return out
