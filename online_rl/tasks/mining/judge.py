"""Judge completions of mined tasks: the code file with the completion as the body, the task's hidden tests run on it.

The source's files are read from the task's root (the mining cache); the code file is rebuilt as prefix + completion
+ suffix and the task's kept tests (and only those) run on it once in the sandbox (online_rl.sandbox.suite). The
reward is the share of those tests that pass. A cache whose code file changed since mining is refused, not judged.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from online_rl.sandbox import suite
from online_rl.sandbox.judge import Verdict
from online_rl.tasks.mining.sources import ship
from online_rl.tasks.mining.store import MinedTask, sha256


@dataclass
class MinedVerdict(Verdict):
    """A one-function verdict's fields and reward, with the job's wall time (no hostile attempts are audited)."""

    wall_s: float = 0.0


@functools.lru_cache(maxsize=32)
def _shipped(root: Path, path: str, test_path: str, ship_all: bool) -> dict[str, str]:
    """A source's files as they travel into the jail, read once for every completion judged against them."""
    return ship(root, path, test_path, ship_all)


def job_for(task: MinedTask, body: str | None) -> suite.SuiteJob:
    """The sandbox job that runs `task`'s tests on its file with `body` (None: the reference)."""
    root = Path(task.root)
    files = dict(_shipped(root, task.path, task.test_path, task.ship_all))
    original = task.prefix + task.reference + task.suffix
    if sha256(original) != task.code_sha256:
        raise ValueError(f"{task.task_id}: the task's code does not match what was mined")
    if task.code_sha256 not in (sha256(files[task.path]), sha256(files[task.path] + "\n")):
        raise ValueError(f"{task.task_id}: {root / task.path} changed since it was mined")
    files[task.path] = original if body is None else task.code_with(body)
    return suite.SuiteJob(files, task.test_module, list(task.paths), list(task.test_ids), list(task.fresh), 1)


def judge(pairs: list[tuple[MinedTask, str | None]], cfg: suite.SuiteConfig | None = None) -> list[MinedVerdict]:
    """One verdict per (task, completion) pair, in order; completion None judges the reference."""
    cfg = cfg or suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30)

    def one(pair: tuple[MinedTask, str | None]) -> MinedVerdict:
        task, body = pair
        (run,) = suite.run([job_for(task, body)], suite.SuiteConfig(**{**cfg.__dict__, "workers": 1}))
        passed = sum(1 for t in task.test_ids if run.outcomes.get(t) == ["pass"])
        error = run.error or ("wall time limit" if run.timed_out else None)
        return MinedVerdict(passed, len(task.test_ids), error, wall_s=run.wall_s)

    if cfg.workers <= 1 or len(pairs) <= 1:
        return [one(p) for p in pairs]
    with ThreadPoolExecutor(min(cfg.workers, len(pairs)), thread_name_prefix="mined-judge") as pool:
        return list(pool.map(one, pairs))
