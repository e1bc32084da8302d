"""The eval gate's judgement: each metric of the held-out suite, candidate against the serving version, with a
one-sided test and a margin; any regression blocks the version.

A proportion (pass@1, agent-session success, valid tool calls, empty or refused answers) is compared as the canary
compares acceptance (weight_sync.canary.judge.diff_bound: candidate minus baseline, unpooled normal approximation,
`confidence` one-sided): a metric where higher is better regresses when the upper bound of the difference is below
-margin (worse by more than the margin, with confidence); one where lower is better when the lower bound is above
+margin. The mean answer length regresses either way, longer or shorter, when its bound (Welch's normal
approximation) is beyond `margin` times the baseline's mean. A version whose figures are only noisy passes: the
gate blocks what is measured worse, and the canary then judges what users do.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from statistics import NormalDist

from weight_sync.canary.judge import diff_bound


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # proportion | mean
    better: str  # higher | lower | near (a mean that may not move far either way)
    margin: float  # proportions: in points of the rate; means: a share of the baseline's mean


@dataclass
class Judgement:
    verdict: str  # pass | block
    reason: str
    figures: dict = field(default_factory=dict)


def _mean_bound(c: list[float], b: list[float], confidence: float) -> tuple[float, float, float]:
    """(mean of c - mean of b, lower and upper one-sided bounds): Welch's standard error, normal quantile."""
    diff = statistics.fmean(c) - statistics.fmean(b)
    var_c = statistics.variance(c) if len(c) > 1 else 0.0
    var_b = statistics.variance(b) if len(b) > 1 else 0.0
    se = math.sqrt(var_c / len(c) + var_b / len(b)) or 1e-9
    z = NormalDist().inv_cdf(confidence)
    return diff, diff - z * se, diff + z * se


def compare(metric: Metric, candidate: list, baseline: list, confidence: float) -> dict:
    """One metric's figures and whether it regressed (`regressed`); an arm with no outcomes is an error."""
    if not candidate or not baseline:
        raise ValueError(
            f"{metric.name}: no outcomes to compare ({len(candidate)} candidate, {len(baseline)} baseline)"
        )
    if metric.kind == "proportion":
        x_c, x_b = sum(map(bool, candidate)), sum(map(bool, baseline))
        diff, lo, hi = diff_bound(x_c, len(candidate), x_b, len(baseline), confidence)
        value_c, value_b, margin = x_c / len(candidate), x_b / len(baseline), metric.margin
    else:
        diff, lo, hi = _mean_bound([float(x) for x in candidate], [float(x) for x in baseline], confidence)
        value_c, value_b = statistics.fmean(candidate), statistics.fmean(baseline)
        margin = metric.margin * max(value_b, 1e-9)
    worse = {"higher": hi < -margin, "lower": lo > margin, "near": hi < -margin or lo > margin}[metric.better]
    return {
        "candidate": round(value_c, 4),
        "baseline": round(value_b, 4),
        "diff": round(diff, 4),
        "lower": round(lo, 4),
        "upper": round(hi, 4),
        "margin": round(margin, 4),
        "n": [len(candidate), len(baseline)],
        "better": metric.better,
        "regressed": bool(worse),
    }


def judge(metrics: tuple[Metric, ...], candidate: dict, baseline: dict, confidence: float) -> Judgement:
    """The verdict over every metric (the suite's outcomes by metric name, per arm): block on any regression."""
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence {confidence} is not in (0.5, 1)")
    figures = {m.name: compare(m, candidate[m.name], baseline[m.name], confidence) for m in metrics}
    worse = [name for name, f in figures.items() if f["regressed"]]
    if worse:
        why = "; ".join(
            f"{n} {figures[n]['candidate']:g} vs {figures[n]['baseline']:g} (bound "
            f"{figures[n]['upper' if figures[n]['diff'] < 0 else 'lower']:+.3f}, margin {figures[n]['margin']:g})"
            for n in worse
        )
        return Judgement("block", f"regressed at {confidence:.0%} confidence: {why}", figures)
    return Judgement("pass", f"no metric worse beyond its margin at {confidence:.0%} confidence", figures)
