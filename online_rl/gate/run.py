"""The eval gate: before a version is announced, judge it against the version the fleet serves on the held-out
suite (online_rl.gate.suite, both rebuilt from the store and run in this process: the spare capacity of whoever
runs the gate), then record the verdict (weight_sync.gate: a signed `gate` record on the weights topic and in the
store) and announce the version only if it passed.

    publish(..., announce_now=False) -> run_gate(version) -> pass:  gate record, then the version's announcement
                                                          -> block: gate record only (the version stays in the store)

What a version's evaluation cost (wall and CPU seconds, rebuilding included) is in the record's figures. A gate that
judges several versions against the same serving version (`flywheel gate --follow`, or its queue) runs the serving
version's suite once, and a version it judged before needs no second run as the next one's baseline (BaselineCache).
"""

from __future__ import annotations

import logging
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.config import nested, option
from online_rl.gate import suite as S
from online_rl.gate.verdict import Judgement, Metric, judge
from weight_sync import gate as wgate
from weight_sync.manifest import ManifestError, load_private
from weight_sync.publish import PublishConfig
from weight_sync.store.rebuild import RebuildError, rebuild
from weight_sync.store.server import Store

log = logging.getLogger(__name__)


@dataclass
class GateConfig:
    publish: PublishConfig = field(default_factory=PublishConfig)  # the store, the signing key, the weights topic
    suite: S.SuiteConfig = nested(S.SuiteConfig)
    confidence: float = option(0.95, help="one-sided confidence of every metric's test")
    pass_margin: float = option(0.05, help="pass@1 drop (rate) that blocks, beyond the confidence bound")
    session_margin: float = option(0.05, help="agent-session success drop (rate) that blocks")
    tool_margin: float = option(0.05, help="valid-tool-call rate drop that blocks")
    empty_margin: float = option(0.02, help="rise in empty or refused answers (rate) that blocks")
    length_margin: float = option(
        0.5, help="answer length change, either way, as a share of the baseline's, that blocks"
    )
    work: Path | None = option(None, help="where the two versions are rebuilt (None: a temporary directory)")

    def metrics(self) -> tuple[Metric, ...]:
        return (
            Metric("pass_at_1", "proportion", "higher", self.pass_margin),
            Metric("session_success", "proportion", "higher", self.session_margin),
            Metric("valid_tool_call_rate", "proportion", "higher", self.tool_margin),
            Metric("empty_or_refusal", "proportion", "lower", self.empty_margin),
            Metric("answer_tokens", "mean", "near", self.length_margin),
        )


@dataclass
class GateResult:
    version: int
    baseline: int
    judgement: Judgement
    record: dict  # the signed gate record as sent
    seconds: float
    cpu_seconds: float

    @property
    def verdict(self) -> str:
        return self.judgement.verdict


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime  # the sandbox's runners are children


# (baseline version, the suite's settings) -> its outcomes: a gate judging version after version against the same
# serving version runs its suite once (a published version never changes, and the suite is seeded).
BaselineCache = dict[tuple[int, str], dict[str, list]]
CACHE_VERSIONS = 4  # the most recent kept: a follower judges each version against the one before, or the serving one


def remember(cache: BaselineCache, key: tuple[int, str], outcomes: dict[str, list]) -> None:
    """Keep `outcomes` as the most recent entry, dropping the oldest beyond CACHE_VERSIONS (a follower runs long)."""
    cache.pop(key, None)
    cache[key] = outcomes
    while len(cache) > CACHE_VERSIONS:
        del cache[next(iter(cache))]


def evaluate(
    cfg: GateConfig, version: int, baseline: int, cache: BaselineCache | None = None
) -> tuple[Judgement, dict]:
    """The judgement of `version` against `baseline` (both in the store) and the seconds each step took."""
    store = Store(cfg.publish.store)
    public = load_private(cfg.publish.private_key).public_key()
    cache = {} if cache is None else cache
    key = (baseline, repr(cfg.suite))
    work = Path(tempfile.mkdtemp(prefix="flywheel-gate-", dir=cfg.work))
    seconds = {"baseline": 0.0}  # 0: its outcomes from an earlier gate of this process
    try:
        t = time.monotonic()
        try:
            dirs = {"candidate": rebuild(store, version, work / f"v{version}", public)}
        except (ManifestError, RebuildError) as e:  # a manifest that does not verify, a chunk that rebuilds wrong
            seconds["rebuild"] = time.monotonic() - t
            return Judgement(
                "block", f"the candidate does not rebuild as signed: {e}", {"verification": str(e)}
            ), seconds
        if key not in cache:
            dirs["baseline"] = rebuild(store, baseline, work / f"v{baseline}", public)
        seconds["rebuild"] = time.monotonic() - t
        outcomes = {}
        for arm, path in dirs.items():
            t = time.monotonic()
            outcomes[arm] = S.run(path, cfg.suite)
            seconds[arm] = time.monotonic() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = outcomes["baseline"] if "baseline" in outcomes else cache[key]
    remember(cache, key, base)
    # The suite is seeded: a candidate's outcomes are its outcomes as a baseline too, so a gate following a trainer
    # (the fleet moving to each version that passes) runs one suite per version, not two.
    remember(cache, (version, repr(cfg.suite)), outcomes["candidate"])
    return judge(cfg.metrics(), outcomes["candidate"], base, cfg.confidence), seconds


def run_gate(cfg: GateConfig, version: int, baseline: int, cache: BaselineCache | None = None) -> GateResult:
    """Judge `version` against `baseline`, record the verdict, and announce the version if it passed. `cache`:
    the baseline's outcomes kept from one call to the next (a gate that judges many versions)."""
    store = Store(cfg.publish.store)
    for v in (version, baseline):
        if v not in store.versions():
            raise ValueError(f"version {v} is not in the store (have {store.versions()})")
    if version == baseline:
        raise ValueError(f"v{version} cannot be gated against itself: give the version the fleet serves")
    if version in store.gate_verdicts():
        raise ValueError(f"v{version} already has a gate verdict ({store.gate_verdicts()[version]['verdict']})")
    t0, cpu0 = time.monotonic(), _cpu_seconds()
    judgement, seconds = evaluate(cfg, version, baseline, cache)
    wall, cpu = time.monotonic() - t0, _cpu_seconds() - cpu0
    figures = {
        **judgement.figures,
        "suite": {"tasks": cfg.suite.tasks, "sessions": cfg.suite.sessions, "samples": cfg.suite.samples},
        "confidence": cfg.confidence,
        "seconds": {k: round(v, 2) for k, v in seconds.items()} | {"total": round(wall, 2)},
        "cpu_seconds": round(cpu, 2),
    }
    record = wgate.decide(cfg.publish, version, judgement.verdict, judgement.reason, baseline, figures)
    log.info("gate v%d against v%d: %s (%s) in %.1fs", version, baseline, judgement.verdict, judgement.reason, wall)
    return GateResult(version, baseline, judgement, record, wall, cpu)
