"""Mined tasks (issue #50): feature-deletion tasks from code no one here wrote, verified in the sandbox.

Mines the standard library (with Debian's libpython3.11-testsuite) and pinned PyPI sdists that ship their tests
(online_rl.tasks.mining.sources.PINNED), each capped at a number of candidates (the cap bounds the sandbox time), and
writes the tasks to $FLYWHEEL_HOME/tasks/mined/SOURCE/. Then judges a sample of the valid tasks in the sandbox, with
the reference body (must pass) and with the body deleted (must fail): `rollouts_per_s` is that judging rate, one
rollout being one completion judged by its task's hidden tests (generation not included), and the two pass rates
check the tasks once more. Prints one JSON object as the last line.

Then the tiny test model (preset `test`, as built in $FLYWHEEL_HOME/models; skipped if it is not built) as a rollout
policy on mined tasks (online_rl.tasks.mining.mixture: the prompt a rollout sends, the judge it uses): one greedy and
ROLLOUT_SAMPLES temperature-1 completions per task, generated on the CPU in this process and judged in the sandbox:
`tiny_model_pass_rate_*` (near zero is the expected figure: it learnt only the synthetic families) and
`rollouts_per_s` (generation and judging; the off-peak rollouts generate on replicas instead).

`--mode feature` (or FLYWHEEL_MINE_MODE=feature) mines whole features instead (a function with its call sites:
online_rl.tasks.mining.verify_feature) into $FLYWHEEL_HOME/tasks/mined-feature/SOURCE-feature/, judges the sample
with the reference files and with the feature deleted, and skips the tiny model (a feature's answer is whole files,
far past what it writes). Its results go to benchmarks/results/tasks_feature.json.

Environment: FLYWHEEL_MINE_CAP (candidates per PyPI source, default 120), FLYWHEEL_MINE_STDLIB_CAP (default 300),
FLYWHEEL_MINE_WORKERS (sandbox runs at once, default 2), FLYWHEEL_MINE_SOURCES (comma-separated, default all),
FLYWHEEL_MINE_REUSE=1 (read each source's summary.json and tasks.jsonl from the last run instead of mining again;
tasks verified by another suite runner than this checkout's are verified again first, and the files rewritten).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time

from infra.paths import flywheel_home
from online_rl.sandbox import suite
from online_rl.tasks.mining import cli, sources
from online_rl.tasks.mining.judge import judge
from online_rl.tasks.mining.store import FeatureTask
from online_rl.tasks.mining.verify import MiningConfig

SOURCES = ("stdlib", *sources.PINNED)
JUDGE_SAMPLE = 60
ROLLOUT_TASKS = 40
ROLLOUT_SAMPLES = 4
ROLLOUT_TOKENS = 64


def tiny_model_rollouts(tasks: list, workers: int) -> dict:
    """The tiny test model's pass rate on mined tasks, and rollouts (generated and judged) per second."""
    import torch
    from tokenizers import Tokenizer

    from online_rl.model.bootstrap import cached_dir
    from online_rl.model.presets import preset
    from online_rl.model.tokenizer import tokenizer_tools
    from online_rl.model.transformer import load_pretrained
    from online_rl.tasks.mining.mixture import prompt_of

    model_dir = cached_dir(preset("test"))
    if not (model_dir / "model.safetensors").exists():
        return {"tiny_model": f"not built ({model_dir}): build it with the test suite or `flywheel model build`"}
    torch.set_num_threads(max(1, workers))
    model = load_pretrained(model_dir).eval()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    stop = tokenizer_tools(model_dir, model.cfg.eos_ids)[3]
    sample = random.Random(1).sample(tasks, min(ROLLOUT_TASKS, len(tasks)))
    gen = torch.Generator().manual_seed(0)
    t0 = time.monotonic()
    pairs = []
    for task in sample:
        ids = tok.encode(prompt_of(task)).ids
        greedy = model.generate([ids], ROLLOUT_TOKENS, 0.0, stop)
        sampled = model.generate([ids] * ROLLOUT_SAMPLES, ROLLOUT_TOKENS, 1.0, stop, generator=gen)
        pairs += [(task, tok.decode(out)) for out in greedy + sampled]
    gen_s = time.monotonic() - t0
    verdicts = judge(pairs, suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30, workers=workers))
    total_s = time.monotonic() - t0
    per = 1 + ROLLOUT_SAMPLES
    greedy_v = verdicts[::per]
    sampled_v = [v for i, v in enumerate(verdicts) if i % per]
    return {
        "tiny_model": model_dir.name,
        "tiny_model_tasks": len(sample),
        "tiny_model_pass_rate_greedy": round(sum(v.ok for v in greedy_v) / len(greedy_v), 4),
        "tiny_model_pass_rate_t1": round(sum(v.ok for v in sampled_v) / len(sampled_v), 4),
        "tiny_model_mean_reward_t1": round(sum(v.reward for v in sampled_v) / len(sampled_v), 4),
        "tiny_model_example": next((c for _, c in pairs if c.strip()), "")[:300],
        "tiny_model_empty_share": round(sum(not c.strip() for _, c in pairs) / len(pairs), 4),
        "rollouts_per_s": round(len(pairs) / total_s, 2),
        "rollouts_note": f"{len(pairs)} completions ({ROLLOUT_TOKENS} tokens at most) generated on the CPU by the "
        f"tiny model and judged in the sandbox ({workers} at once); generation {gen_s:.1f}s of {total_s:.1f}s",
    }


def _reused(folder, workers: int) -> tuple[dict, list]:
    """A source's figures and tasks from the last run's files; tasks verified by another suite runner than this
    checkout's are verified again (verify.recheck), and the files rewritten to match."""
    from online_rl.tasks.mining import store
    from online_rl.tasks.mining.verify import recheck, runner_digest

    summary = json.loads((folder / "summary.json").read_text())
    tasks = store.load([folder / "tasks.jsonl"])
    if summary.get("runner") == runner_digest():
        return summary, tasks
    kept, rejected, seconds = recheck(tasks, workers)
    store.save(kept, folder / "tasks.jsonl")
    with open(folder / "rejected.jsonl", "a") as f:
        for r in rejected:
            f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    for r in rejected:
        summary["rejected"][r.reason] = summary["rejected"].get(r.reason, 0) + 1
    summary["valid"] = len(kept)
    summary["sandbox_s"] = round(summary["sandbox_s"] + seconds, 2)
    summary["sandbox_s_per_task"] = round(summary["sandbox_s"] / len(kept), 3) if kept else None
    rechecks = summary.get("rechecked", [])
    rechecks = [rechecks] if isinstance(rechecks, dict) else rechecks
    summary["rechecked"] = [*rechecks, {"tasks": len(tasks), "rejected": len(rejected), "sandbox_s": round(seconds, 2)}]
    summary["runner"] = runner_digest()
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary, kept


def main(mode: str = "body") -> dict:
    cap = int(os.environ.get("FLYWHEEL_MINE_CAP", "120"))
    stdlib_cap = int(os.environ.get("FLYWHEEL_MINE_STDLIB_CAP", "300"))
    workers = int(os.environ.get("FLYWHEEL_MINE_WORKERS", "2"))
    names = [s for s in os.environ.get("FLYWHEEL_MINE_SOURCES", ",".join(SOURCES)).split(",") if s]
    out = flywheel_home() / "tasks" / ("mined" if mode == "body" else "mined-feature")
    per_source, tasks, rejected = {}, [], {}
    sandbox_s = 0.0
    reuse = os.environ.get("FLYWHEEL_MINE_REUSE") == "1"
    for name in names:
        if reuse:
            result, mined = _reused(out / (name if mode == "body" else f"{name}-feature"), workers)
        else:
            source = sources.resolve(name)
            cfg = MiningConfig(
                mode=mode,  # type: ignore[arg-type]  # checked by the flag's choices
                max_candidates=stdlib_cap if name == "stdlib" else cap,
                max_per_test_file=4 if name == "stdlib" else 40,
                workers=workers,
            )
            report = cli.mine(source, cfg, progress=sys.stderr.isatty())
            result = cli.write(report, cfg, out)
            mined = report.tasks
        print(json.dumps({k: v for k, v in result.items() if k != "config"}), file=sys.stderr, flush=True)
        keys = ("version", "origin", "found", "candidates", "valid", "rejected", "rechecked")
        per_source[name] = {k: result[k] for k in keys if k in result}
        per_source[name]["sandbox_s_per_task"] = result["sandbox_s_per_task"]
        tasks += mined
        sandbox_s += result["sandbox_s"]
        for reason, n in result["rejected"].items():
            rejected[reason] = rejected.get(reason, 0) + n

    sample = random.Random(0).sample(tasks, min(JUDGE_SAMPLE, len(tasks)))
    deleted = [t.shown if isinstance(t, FeatureTask) else t.indent + "raise NotImplementedError\n" for t in sample]
    pairs = [(t, None) for t in sample] + list(zip(sample, deleted))
    t0 = time.monotonic()
    verdicts = judge(pairs, suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30, workers=workers))
    judge_s = time.monotonic() - t0
    ref, empty = verdicts[: len(sample)], verdicts[len(sample) :]
    candidates = sum(p["candidates"] for p in per_source.values())
    return {
        "valid_tasks": len(tasks),
        "sources": per_source,
        "candidates": candidates,
        "rejected": dict(sorted(rejected.items())),
        "sandbox_s": round(sandbox_s, 1),
        "sandbox_s_per_task": round(sandbox_s / len(tasks), 3) if tasks else None,
        "sandbox_s_per_candidate": round(sandbox_s / candidates, 3) if candidates else None,
        "judged_per_s": round(len(pairs) / judge_s, 2) if judge_s else None,
        "judged_note": f"judging only (sandbox, {workers} at once): {len(pairs)} completions of {len(sample)} tasks",
        "mode": mode,
        **(tiny_model_rollouts(tasks, workers) if mode == "body" else {"tiny_model": "not run in feature mode"}),
        "reference_pass_rate": round(sum(v.ok for v in ref) / len(ref), 3) if ref else None,
        "deleted_body_pass_rate": round(sum(v.ok for v in empty) / len(empty), 3) if empty else None,
        "workers": workers,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.tasks")
    ap.add_argument("--mode", choices=("body", "feature"), default=os.environ.get("FLYWHEEL_MINE_MODE", "body"))
    print(json.dumps(main(ap.parse_args().mode)))
