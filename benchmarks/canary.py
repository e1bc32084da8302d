"""Canary judgement: feedback and time needed to decide, by true acceptance difference.

weight_sync.canary.judge.judge (default CanaryConfig: min 100 feedback per arm, margin 5 points, 95% one-sided)
on simulated feedback: each arm's events are Bernoulli at its true acceptance (stable 50%), the canary arm
gets `traffic_share` of the users, and the judge is consulted every 10 events, as the controller polls. 200
trials per difference. Time converts events with the feedback rate the demo measured (12.5 feedback events
per second: 6 simulated users on this 2-core machine); a real fleet's rate scales it. Users who saw the
canary during a trial are `traffic_share` of those active, by construction of the split (tested in
tests/unit/weight_sync/canary/test_canary_policy.py); the requests they sent to it are reported. Prints one JSON object.
"""

from __future__ import annotations

import json
import random

import numpy as np

from weight_sync.canary.controller import CanaryConfig
from weight_sync.canary.judge import judge
from weight_sync.publish import PublishConfig

FEEDBACK_PER_S = 12.5
TRIALS = 200
MAX_EVENTS = 20_000  # events (both arms) after which a trial counts as undecided: the time limit rolls it back


def one_trial(rng: random.Random, p_stable: float, diff: float, cfg: CanaryConfig) -> tuple[str, int, int]:
    arms = {"canary": [0, 0], "stable": [0, 0]}  # accepts, total
    for events in range(1, MAX_EVENTS + 1):
        arm = "canary" if rng.random() < cfg.traffic_share else "stable"
        p = p_stable + diff if arm == "canary" else p_stable
        arms[arm][0] += rng.random() < p
        arms[arm][1] += 1
        if events % 10 == 0:
            figures = {
                a: {
                    "requests": n,
                    "errors": 0,
                    "accepts": acc,
                    "rejects": n - acc,
                    "feedback": n,
                    "acceptance": acc / n if n else None,
                    "p99_ms": 100.0,
                }
                for a, (acc, n) in arms.items()
            }
            v = judge(figures["canary"], figures["stable"], cfg)
            if v.decision != "extend":
                return v.decision, events, arms["canary"][1]
    return "rollback (time limit)", MAX_EVENTS, arms["canary"][1]


def main() -> dict:
    cfg = CanaryConfig(gateway_url="", admin_token="", publish=PublishConfig(store=".", private_key="."))
    rng = random.Random(0)
    out = {
        "feedback_per_s": FEEDBACK_PER_S,
        "traffic_share": cfg.traffic_share,
        "margin": cfg.margin,
        "min_feedback": cfg.min_feedback,
        "trials": TRIALS,
    }
    for points in (-20, -10, -5, 0, 10):
        runs = [one_trial(rng, 0.5, points / 100, cfg) for _ in range(TRIALS)]
        decisions = [d for d, _, _ in runs]
        events = np.array([e for _, e, _ in runs])
        key = f"diff_{points:+d}pts"
        out[key] = {
            "rollback_share": round(sum(d.startswith("rollback") for d in decisions) / TRIALS, 3),
            "promote_share": round(decisions.count("promote") / TRIALS, 3),
            "undecided_share": round(sum("time limit" in d for d in decisions) / TRIALS, 3),
            "feedback_events_median": int(np.median(events)),
            "feedback_events_p90": int(np.percentile(events, 90)),
            "seconds_median": round(float(np.median(events)) / FEEDBACK_PER_S, 1),
            "canary_requests_median": int(np.median([c for _, _, c in runs])),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
