"""Judge completions of mined tasks: the task's hidden tests run on the source with the completion in place.

The source's files are read from the task's root (the mining cache). A body task's code file is rebuilt as prefix +
completion + suffix; a feature task's changed files are the ones its answer restores (store.FeatureTask.files_of:
a file the answer leaves out stays deleted). A whole file (an agent that wrote it) goes in as written (`files`).
The task's kept tests (and only those) run on it once in the sandbox (online_rl.sandbox.suite). The reward is the
share of those tests that pass. A cache whose code changed since mining is refused, not judged.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from online_rl.sandbox import suite
from online_rl.sandbox.judge import Verdict
from online_rl.tasks.mining.sources import ship
from online_rl.tasks.mining.store import FeatureTask, MinedTask, sha256

Answer = str | dict[str, str] | None  # a body or a feature answer; whole files by path; None: the reference


@dataclass
class MinedVerdict(Verdict):
    """A one-function verdict's fields and reward, with the job's wall time (no hostile attempts are audited)."""

    wall_s: float = 0.0


@functools.lru_cache(maxsize=32)
def _shipped(root: Path, path: str, test_path: str, ship_all: bool) -> dict[str, str]:
    """A source's files as they travel into the jail, read once for every completion judged against them."""
    return ship(root, path, test_path, ship_all)


def _check(task: MinedTask | FeatureTask, files: dict[str, str], originals: dict[str, str]) -> None:
    for path, original in originals.items():
        want = task.code_sha256 if isinstance(task.code_sha256, str) else task.code_sha256[path]
        if sha256(original) != want:
            raise ValueError(f"{task.task_id}: the task's code does not match what was mined")
        if want not in (sha256(files.get(path, "")), sha256(files.get(path, "") + "\n")):
            raise ValueError(f"{task.task_id}: {Path(task.root) / path} changed since it was mined")


def job_for(task: MinedTask | FeatureTask, answer: Answer) -> suite.SuiteJob:
    """The sandbox job that runs `task`'s tests with `answer` in place (None: the reference)."""
    files = dict(_shipped(Path(task.root), task.path, task.test_path, task.ship_all))
    if isinstance(task, FeatureTask):
        _check(task, files, task.reference)
        files.update(task.reference if answer is None else task.files_of(answer))
    else:
        original = task.prefix + task.reference + task.suffix
        _check(task, files, {task.path: original})
        if isinstance(answer, dict):
            files[task.path] = answer.get(task.path, task.prefix + task.indent + "raise NotImplementedError\n")
            files[task.path] += "" if files[task.path].endswith("\n") else "\n"
        else:
            files[task.path] = original if answer is None else task.code_with(answer)
    return suite.SuiteJob(files, task.test_module, list(task.paths), list(task.test_ids), list(task.fresh), 1)


def judge(
    pairs: list[tuple[MinedTask | FeatureTask, Answer]], cfg: suite.SuiteConfig | None = None
) -> list[MinedVerdict]:
    """One verdict per (task, answer) pair, in order; answer None judges the reference."""
    cfg = cfg or suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30)

    def one(pair: tuple[MinedTask | FeatureTask, Answer]) -> MinedVerdict:
        task, answer = pair
        (run,) = suite.run([job_for(task, answer)], suite.SuiteConfig(**{**cfg.__dict__, "workers": 1}))
        passed = sum(1 for t in task.test_ids if run.outcomes.get(t) == ["pass"])
        error = run.error or ("wall time limit" if run.timed_out else None)
        return MinedVerdict(passed, len(task.test_ids), error, wall_s=run.wall_s)

    if cfg.workers <= 1 or len(pairs) <= 1:
        return [one(p) for p in pairs]
    with ThreadPoolExecutor(min(cfg.workers, len(pairs)), thread_name_prefix="mined-judge") as pool:
        return list(pool.map(one, pairs))
