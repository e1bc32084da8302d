"""Mine a source: each candidate's tests run with and without its body in the sandbox, kept or rejected with a reason.

For each test file drawn, one baseline run on the original code (MiningConfig.repeats repeats in one sandbox) says
which tests pass every time, which are flaky and how long each takes. Then, per candidate (online_rl.tasks.mining
.candidates), one run of that file with the body deleted: the tests that passed every time and now fail are the
candidate's. Those (at most max_tests, none slower than slow_test_s) are verified again, alone, in two fresh
sandboxes: with the body they must pass in every repeat, without it fail in every repeat; and once more with an
empty body (`pass`: the function returns None), where they must fail too (a test that only checks that nothing
raises would pass a completion that writes nothing). What survives is a task
(online_rl.tasks.mining.store). Every candidate that is not one gets one reason (REASONS) and a line saying why.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from infra.config import option
from infra.progress import bar
from online_rl.sandbox import suite
from online_rl.tasks.mining.candidates import MARKER, Deletion, find
from online_rl.tasks.mining.features import Feature
from online_rl.tasks.mining.sources import Source
from online_rl.tasks.mining.store import FeatureTask, MinedTask, sha256

REASONS = (
    "unparsable",  # the code file does not parse
    "trivial",  # the body is only pass, `...`, a raise or a bare return
    "too_short",  # fewer lines of code than min_lines
    "too_long",  # more than max_lines
    "no_tests_reach",  # no test file mentions the function (or its module, for a private one)
    "fails_with_code",  # the test file does not import, or no test of it passes on the original (alone)
    "slow",  # a run past the time limit, or only tests slower than slow_test_s break
    "passes_without_code",  # every test that passed with the body still passes without it
    "flaky",  # the only tests that break are ones whose outcome differs between repeats
    # feature mode (online_rl.tasks.mining.features, verify_feature)
    "no_call_sites",  # no code of the repository calls it
    "used_as_value",  # it is named other than in a call (a callback, a property, a decorator)
    "unremovable_call_site",  # a call that is no simple statement of its own (`if f(x):`, a decorator, ...)
    "passes_without_call_sites",  # the kept tests pass with the definition back and its calls still gone
)
BROKEN = ("fail", "error")


@dataclass
class MiningConfig:
    mode: Literal["body", "feature"] = option(
        "body", help="what is deleted: a function's body, or a whole feature (its definition and its call sites)"
    )
    max_candidates: int = option(200, help="candidates verified in the sandbox per source, at most (caps its time)")
    max_per_test_file: int = option(25, help="candidates judged by one test file, at most (spreads the draw)")
    min_lines: int = option(3, help="the shortest body mined, in lines of code")
    max_lines: int = option(60, help="the longest body mined, in lines of code")
    repeats: int = option(3, help="runs of a test file on the original code, in one sandbox, to see flaky tests")
    run_timeout_s: float = option(60.0, help="wall-clock limit of one sandbox run (every repeat of a test file)")
    slow_test_s: float = option(5.0, help="a test slower than this on the original code is not kept")
    max_tests: int = option(20, help="tests kept per task, at most")
    workers: int = option(1, help="sandbox runs at once")
    seed: int = option(0, help="which candidates are drawn when there are more than the cap")


@dataclass
class Rejection:
    candidate: str
    reason: str
    detail: str


@dataclass
class MiningReport:
    source: str
    version: str
    origin: str
    found: int = 0  # functions with a body worth deleting and a test file to judge them
    candidates: int = 0  # of those, verified in the sandbox (the draw)
    tasks: list[MinedTask | FeatureTask] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)  # drawn candidates, and those no test reaches
    skipped: Counter[str] = field(default_factory=Counter)  # passed over before the sandbox (unparsable, ...)
    sandbox_s: float = 0.0  # wall seconds of every sandbox run
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        """Rejections by reason, those before the sandbox included."""
        c = Counter(self.skipped) + Counter(r.reason for r in self.rejected)
        return {r: c[r] for r in REASONS if c[r]}


@dataclass
class _Plan:
    deletion: Deletion
    test: str
    key: tuple[str, str]  # the baseline it shares
    feature: Feature | None = None  # feature mode: the whole feature the deletion's function is


def classify(base: suite.SuiteRun, without: suite.SuiteRun, slow_test_s: float, max_tests: int):
    """(reason or None, the tests to keep, why) from a test file's baseline and its run without the body."""
    if base.error:
        return "fails_with_code", [], base.error
    if base.timed_out:
        return "slow", [], "the test file ran past the time limit with the body"
    stable = base.stable("pass")
    if not stable:
        return "fails_with_code", [], "no test passes every time with the body"
    if without.timed_out:
        return "slow", [], "the tests ran past the time limit without the body"
    if without.error:  # the test module does not even import without it: every test breaks
        broken = set(stable)
    else:
        broken = {t for t in stable if any(o in BROKEN for o in without.outcomes.get(t, ["error"]))}
    if not broken:
        flaky = {t for t in base.flaky() if any(o in BROKEN for o in without.outcomes.get(t, []))}
        if flaky:
            return "flaky", [], f"only tests flaky with the body break: {', '.join(sorted(flaky)[:3])}"
        return "passes_without_code", [], f"all {len(stable)} passing tests still pass without the body"
    fast = sorted(t for t in broken if base.seconds.get(t, 0.0) <= slow_test_s)
    if not fast:
        return "slow", [], f"the {len(broken)} tests that break each take over {slow_test_s:g}s"
    return None, fast[:max_tests], f"{len(broken)} tests break"


def confirm(with_body: suite.SuiteRun, without: suite.SuiteRun):
    """(reason or None, the tests kept, why) from the kept tests run alone with and without the body."""
    if with_body.timed_out or without.timed_out:
        return "slow", [], "the kept tests ran past the time limit when run alone"
    passing = with_body.stable("pass")
    if not passing:
        if any("pass" in o for o in with_body.outcomes.values()):
            return "flaky", [], "the kept tests passed in one repeat with the body and not in another"
        return "fails_with_code", [], "the kept tests fail with the body when run alone (they need other tests)"
    failing = {t for t, o in without.outcomes.items() if o and all(x in BROKEN for x in o)}
    if without.error:
        failing = set(passing)
    kept = sorted(passing & failing)
    if not kept:
        return "flaky", [], "the tests that broke without the body passed in a second run without it"
    return None, kept, f"{len(kept)} tests pass with the body and fail without it, every time"


def _needed(run: suite.SuiteRun, kept: list[str], without: str, reason: str, why_none: str, why_kept: str):
    """(reason or None, the kept tests that fail `without` something, why): none failing is `reason`."""
    if run.timed_out:
        return "slow", [], f"the kept tests ran past the time limit {without}"
    left = [t for t in kept if run.outcomes.get(t) != ["pass"]]
    if not left:
        return reason, [], why_none
    return None, left, f"{len(left)} tests {why_kept}"


def hollow(run: suite.SuiteRun, kept: list[str]):
    """(reason or None, the tests kept, why) from the kept tests run with an empty body (`pass`)."""
    return _needed(
        run,
        kept,
        "with an empty body",
        "passes_without_code",
        "the kept tests pass with an empty body (the function returning None)",
        "pass with the body and fail without it or with an empty one",
    )


def wiring(run: suite.SuiteRun, kept: list[str]):
    """(reason or None, the tests kept, why) from the kept tests run with a feature's definition back and its call
    sites still gone: a test that passes so judges the function alone, not the feature."""
    return _needed(
        run,
        kept,
        "without the call sites",
        "passes_without_call_sites",
        "the kept tests pass with the definition back and no call to it",
        "need the definition and its call sites",
    )


def empty_body(prefix: str, indent: str, suffix: str) -> str:
    return prefix + indent + "pass\n" + suffix


def runner_digest() -> str:
    """Which runner verified a task: tasks verified by another one are verified again (verify.recheck)."""
    return sha256(suite.suite_runner_source())[:16]


def recheck(tasks: list, workers: int = 1) -> tuple[list, list[Rejection], float]:
    """Stored tasks verified again as mining does, once each: the kept tests must pass with the reference and fail
    with the body deleted and with an empty one (a feature task: with the feature deleted, and with its definition
    back but its call sites gone). (those that hold, with the tests that still judge them, the rejected, sandbox
    seconds). For tasks mined by an earlier runner or before a check was added."""
    from online_rl.tasks.mining.judge import job_for

    jobs = []
    for t in tasks:
        if isinstance(t, FeatureTask):
            jobs += [job_for(t, None), job_for(t, t.shown), job_for(t, t.files_without_calls())]
        else:
            jobs += [job_for(t, None), job_for(t, t.indent + MARKER + "\n"), job_for(t, t.indent + "pass\n")]
    runs = suite.run(jobs, suite.SuiteConfig(wall_seconds=60.0, cpu_seconds=61, workers=workers))
    kept, rejected = [], []
    for i, task in enumerate(tasks):
        ref, gone, other = runs[3 * i : 3 * i + 3]
        reason, tests, why = confirm(ref, gone)
        if not reason:
            reason, tests, why = (wiring if isinstance(task, FeatureTask) else hollow)(other, tests)
        spent = ref.wall_s + gone.wall_s + other.wall_s
        if reason:
            rejected.append(Rejection(task.task_id.split("/", 1)[-1], reason, why))
        else:
            kept.append(dataclasses.replace(task, test_ids=tuple(tests), sandbox_s=round(task.sandbox_s + spent, 3)))
    return kept, rejected, sum(r.wall_s for r in runs)


class _Provenance(TypedDict):
    task_id: str
    source: str
    version: str
    origin: str
    root: str
    path: str
    qualname: str
    test_path: str
    test_module: str
    paths: tuple[str, ...]
    fresh: tuple[str, ...]
    ship_all: bool


class _Miner:
    def __init__(self, source: Source, cfg: MiningConfig):
        self.source, self.cfg = source, cfg
        self.suite_cfg = suite.SuiteConfig(wall_seconds=cfg.run_timeout_s, cpu_seconds=int(cfg.run_timeout_s) + 1)
        self._shipped: dict[tuple[str, str], dict[str, str]] = {}

    def key(self, code: str, test: str) -> tuple[str, str]:
        return ("", test) if self.source.ship_all else (code, test)

    def files(self, code: str, test: str) -> dict[str, str]:
        k = self.key(code, test)
        if k not in self._shipped:
            if self.source.ship_all and ("", "") in self._shipped:
                self._shipped[k] = self._shipped[("", "")]
            else:
                self._shipped[k] = self.source.shipped(code, test)
                if self.source.ship_all:
                    self._shipped[("", "")] = self._shipped[k]
        return self._shipped[k]

    def job(self, code: str, test: str, text: str | dict[str, str] | None, select=None, repeats=1) -> suite.SuiteJob:
        files = dict(self.files(code, test))
        if isinstance(text, dict):  # a feature's changed files
            files.update(text)
        elif text is not None:
            files[code] = text
        module, root = self.source.module_of(test)
        paths = list(dict.fromkeys([root, *self.source.paths]))
        fresh = [self.source.module_of(code)[0]]
        return suite.SuiteJob(files, module, paths, select, fresh, repeats)

    def provenance(self, code: str, qualname: str, test: str) -> _Provenance:
        """The fields both kinds of task (MinedTask, FeatureTask) take from the source and the test's jail."""
        job, src = self.job(code, test, None), self.source
        return _Provenance(
            task_id=f"{src.name}/{code}::{qualname}", source=src.name, version=src.version, origin=src.origin,
            root=str(src.root), path=code, qualname=qualname, test_path=test, test_module=job.module,
            paths=tuple(job.paths), fresh=tuple(job.fresh), ship_all=src.ship_all,
        )  # fmt: skip

    def run(self, job: suite.SuiteJob) -> suite.SuiteRun:
        (out,) = suite.run([job], self.suite_cfg)
        return out


def _draw(plans: list[_Plan], cfg: MiningConfig) -> list[_Plan]:
    """At most max_per_test_file per test file and max_candidates in all, spread over the test files."""
    rng = random.Random(cfg.seed)
    groups: dict[str, list[_Plan]] = defaultdict(list)
    for p in plans:
        groups[p.test].append(p)
    queues = []
    for test in sorted(groups):
        g = groups[test]
        rng.shuffle(g)
        queues.append(g[: cfg.max_per_test_file])
    rng.shuffle(queues)
    drawn: list[_Plan] = []
    while len(drawn) < cfg.max_candidates and any(queues):
        for q in queues:
            if q and len(drawn) < cfg.max_candidates:
                drawn.append(q.pop(0))
    return drawn


def mine(source: Source, cfg: MiningConfig | None = None, progress: bool = True) -> MiningReport:
    """Mine one source for deleted bodies: its tasks, its rejections by reason, and the sandbox time it took."""
    cfg = cfg or MiningConfig()
    if cfg.mode != "body":
        raise ValueError(f"verify.mine mines bodies; mode {cfg.mode!r} is mined by cli.mine")
    t0 = time.monotonic()
    report = MiningReport(source.name, source.version, source.origin)
    texts = {t: source.read(t) for t in source.tests}
    plans = []
    for code in source.code:
        deletions, skipped = find(source.read(code), code, cfg.min_lines, cfg.max_lines)
        report.skipped.update(skipped)
        for d in deletions:
            tests = source.tests_for(code, d.name, texts)
            if not tests:
                report.rejected.append(Rejection(f"{code}::{d.qualname}", "no_tests_reach", "no test file names it"))
                continue
            plans.append(_Plan(d, tests[0], ("", "")))
    miner = _Miner(source, cfg)

    def one(p: _Plan, base: suite.SuiteRun, spent: list[float]) -> MinedTask | Rejection:
        d, cand = p.deletion, f"{p.deletion.path}::{p.deletion.qualname}"
        without = miner.run(miner.job(d.path, p.test, d.deleted_source))
        spent.append(without.wall_s)
        reason, kept, why = classify(base, without, cfg.slow_test_s, cfg.max_tests)
        if reason:
            return Rejection(cand, reason, why)
        again = miner.run(miner.job(d.path, p.test, None, select=kept, repeats=2))
        gone = miner.run(miner.job(d.path, p.test, d.deleted_source, select=kept, repeats=2))
        spent += [again.wall_s, gone.wall_s]
        reason, kept, why = confirm(again, gone)
        if reason:
            return Rejection(cand, reason, why)
        empty = miner.run(miner.job(d.path, p.test, empty_body(d.prefix, d.indent, d.suffix), select=kept))
        spent.append(empty.wall_s)
        reason, kept, why = hollow(empty, kept)
        if reason:
            return Rejection(cand, reason, why)
        return MinedTask(
            **miner.provenance(d.path, d.qualname, p.test),
            test_ids=tuple(kept),
            lineno=d.lineno,
            prefix=d.prefix,
            suffix=d.suffix,
            reference=d.body,
            indent=d.indent,
            code_sha256=sha256(d.original),
            sandbox_s=round(sum(spent), 3),
        )

    run_plans(miner, report, plans, one, progress)
    report.wall_s = round(time.monotonic() - t0, 2)
    return report


def run_plans(miner: _Miner, report: MiningReport, plans: list[_Plan], one, progress: bool) -> None:
    """Draw the plans, run one baseline per test file and `one(plan, baseline, spent)` per candidate drawn (a task,
    or a rejection; `spent` collects its sandbox seconds), into the report."""
    source, cfg = miner.source, miner.cfg
    for p in plans:
        p.key = miner.key(p.deletion.path, p.test)
    report.found = len(plans)
    drawn = _draw(plans, cfg)
    report.candidates = len(drawn)
    by_key: dict[tuple[str, str], list[_Plan]] = defaultdict(list)
    for p in drawn:
        by_key[p.key].append(p)
    pool = ThreadPoolExecutor(max(1, cfg.workers), thread_name_prefix="mine")
    try:
        with bar(total=len(by_key), desc=f"{source.name}: baselines", unit="file", enabled=progress) as pb:
            futures = {
                pool.submit(miner.run, miner.job(p[0].deletion.path, p[0].test, None, repeats=cfg.repeats)): k
                for k, p in by_key.items()
            }
            baselines = {}
            for f in as_completed(futures):
                baselines[futures[f]] = f.result()
                pb.update()
        report.sandbox_s += sum(b.wall_s for b in baselines.values())

        def checked(p: _Plan):
            base = baselines[p.key]
            spent = [base.wall_s / len(by_key[p.key])]
            if base.error or base.timed_out or not base.stable("pass"):
                reason, _, why = classify(base, base, cfg.slow_test_s, cfg.max_tests)
                cand = f"{p.deletion.path}::{p.deletion.qualname}"
                return Rejection(cand, reason or "fails_with_code", why), spent
            return one(p, base, spent), spent

        with bar(total=len(drawn), desc=f"{source.name}: candidates", unit="fn", enabled=progress) as pb:
            for done in as_completed([pool.submit(checked, p) for p in drawn]):
                outcome, spent = done.result()
                report.sandbox_s += sum(spent[1:])
                if isinstance(outcome, Rejection):
                    report.rejected.append(outcome)
                else:
                    report.tasks.append(outcome)
                pb.update()
                pb.set_postfix(valid=len(report.tasks))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    report.tasks.sort(key=lambda t: t.task_id)
    report.sandbox_s = round(report.sandbox_s, 2)
