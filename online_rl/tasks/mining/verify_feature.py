"""Mine a source in feature mode: each feature (online_rl.tasks.mining.features: a function's definition and the
statements that call it) deleted, its tests run in the sandbox, kept or rejected with a reason.

The same discipline as a deleted body (online_rl.tasks.mining.verify), with the feature's changed files in place of
one file: one baseline per test file (repeats, flaky tests seen); one run with the feature deleted, whose newly
broken tests are the candidate's; those verified again alone in two fresh sandboxes (pass with the code, fail without
it, every repeat); then two runs that drop the tests a half-restoration passes: the definition back with an empty
body (`pass`) and its calls in place, and the definition back whole with its calls still gone. What survives (at most
max_tests, none slower than slow_test_s) judges the whole feature: a store.FeatureTask.

The test file a feature is judged by is the one that names the function and its callers most (the feature is seen
through its callers); a stdlib module's is its pair's.
"""

from __future__ import annotations

import time

from online_rl.sandbox import suite
from online_rl.tasks.mining import features
from online_rl.tasks.mining.sources import Source
from online_rl.tasks.mining.store import FeatureTask, sha256
from online_rl.tasks.mining.verify import (
    MiningConfig,
    MiningReport,
    Rejection,
    _Miner,
    _Plan,
    classify,
    confirm,
    hollow,
    run_plans,
    wiring,
)


def mine_features(source: Source, cfg: MiningConfig | None = None, progress: bool = True) -> MiningReport:
    """Mine one source for whole features: its tasks, its rejections by reason, and the sandbox time it took."""
    cfg = cfg or MiningConfig(mode="feature")
    t0 = time.monotonic()
    report = MiningReport(source.name, source.version, source.origin)
    texts = {t: source.read(t) for t in source.tests}
    code = {c: source.read(c) for c in source.code}
    modules = {c: source.module_of(c)[0] for c in source.code}
    found, skipped, rejected = features.find(
        code, modules, source.code, cfg.min_lines, cfg.max_lines, same_file_only=not source.ship_all
    )
    report.skipped.update(skipped)
    report.rejected += [Rejection(*r) for r in rejected]
    plans = []
    for f in found:
        tests = source.tests_for(f.path, f.deletion.name, texts, callers=f.callers)
        if not tests:
            report.rejected.append(Rejection(f"{f.path}::{f.qualname}", "no_tests_reach", "no test file names it"))
            continue
        plans.append(_Plan(f.deletion, tests[0], ("", ""), f))
    miner = _Miner(source, cfg)

    def one(p: _Plan, base: suite.SuiteRun, spent: list[float]) -> FeatureTask | Rejection:
        f = p.feature
        assert f is not None
        cand = f"{f.path}::{f.qualname}"

        def run(files: dict[str, str] | None, select=None, repeats=1) -> suite.SuiteRun:
            out = miner.run(miner.job(f.path, p.test, files, select=select, repeats=repeats))
            spent.append(out.wall_s)
            return out

        shown = f.shown
        # Every test the deletion breaks, uncapped: a test module that imports the function breaks as a whole, and
        # the runs below, not the alphabet, say which of its tests judge the feature.
        reason, kept, why = classify(base, run(shown), cfg.slow_test_s, len(base.tests))
        if reason:
            return Rejection(cand, reason, why)
        reason, kept, why = confirm(run(None, kept, 2), run(shown, kept, 2))
        if reason:
            return Rejection(cand, reason, why)
        reason, kept, why = hollow(run(f.empty_body(), kept), kept)
        if reason:
            return Rejection(cand, reason, why)
        reason, kept, why = wiring(run(f.files(definition=False), kept), kept)
        if reason:
            return Rejection(cand, reason, why)
        return FeatureTask(
            **miner.provenance(f.path, f.qualname, p.test),
            lineno=f.deletion.lineno,
            shown=shown,
            reference=dict(f.originals),
            call_sites=tuple(e.provenance() for e in f.edits),
            test_ids=tuple(kept[: cfg.max_tests]),
            code_sha256={path: sha256(text) for path, text in f.originals.items()},
            sandbox_s=round(sum(spent), 3),
        )

    run_plans(miner, report, plans, one, progress)
    report.wall_s = round(time.monotonic() - t0, 2)
    return report
