"""Throughput of several gateways in front of one replica, in paired rounds, with each process's CPU per request.

A round loads every gateway for the same time, in `slices` short turns each, interleaved (on, off, on, off, ...):
the ratio of two gateways is taken within each round, over the same half minute of a shared machine, so that
another tenant's burst of work lands on both alike; the median over rounds is reported with its range. The
order rotates from turn to turn, and runs backwards every other block, so that no gateway always follows the
same one. After each turn the run settles for `settle_s` (the gateway's shipper sends its last burst) inside
that gateway's window, so that none of its work falls into the next gateway's turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from benchmarks import _proc_cpu as pc


@dataclass
class Rounds:
    counts: dict[str, list[int]]  # per gateway, requests served in each round
    cpu_s: dict[str, dict[str, float]]  # per gateway, CPU seconds by part over all its turns
    seconds: float  # load time per turn
    order: list[list[str]] = field(default_factory=list)

    def ratios(self, a: str, b: str) -> list[float]:
        return [x / max(1, y) for x, y in zip(self.counts[a], self.counts[b])]

    def summary(self, a: str, b: str) -> dict[str, float]:
        r = self.ratios(a, b)
        return {"median": round(float(np.median(r)), 3), "min": round(min(r), 3), "max": round(max(r), 3)}

    def cpu_ms_per_request(self, name: str) -> dict[str, float]:
        n = max(1, sum(self.counts[name]))
        out = {k: round(1000 * v / n, 3) for k, v in self.cpu_s[name].items()}
        out["total"] = round(sum(v for k, v in out.items()), 3)
        return out


def order(names: list[str], r: int) -> list[str]:
    """Round r's order: rotated by r, reversed in every other block of len(names) rounds."""
    k = r % len(names)
    rotated = names[k:] + names[:k]
    return rotated[::-1] if (r // len(names)) % 2 else rotated


def run(
    gateways: dict[str, dict[str, pc.Part]],
    load: Callable[[str, float], int],
    rounds: int,
    seconds: float,
    settle_s: float = 1.0,
    slices: int = 1,
) -> Rounds:
    """`gateways`: name -> the parts whose CPU its turns are charged with (its own process, its shipper, and the
    shared ones: replica, broker, load generator); `load(name, seconds)` loads that gateway and returns how many
    requests it served. Each gateway is loaded `seconds` per round, in `slices` turns."""
    names = list(gateways)
    res = Rounds({n: [] for n in names}, {n: {} for n in names}, seconds)
    for r in range(rounds):
        served = dict.fromkeys(names, 0)
        for s in range(slices):
            res.order.append(order(names, r * slices + s))
            for name in res.order[-1]:
                before = pc.snapshot(gateways[name])
                served[name] += load(name, seconds / slices)
                time.sleep(settle_s)
                after = pc.snapshot(gateways[name])
                acc = res.cpu_s[name]
                for k in after:
                    acc[k] = acc.get(k, 0.0) + after[k] - before[k]
        for name in names:
            res.counts[name].append(served[name])
    for acc in res.cpu_s.values():  # the machine's busy time none of the parts account for
        acc["other"] = acc.pop("machine") - sum(acc.values())
    return res
