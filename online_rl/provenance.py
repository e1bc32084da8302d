"""Which tenants' samples each published version was trained on.

At each version it publishes (online_rl.publisher), the trainer writes `<work_dir>/provenance/v<N>.json`
(atomically):

    {"version": N, "step": S, "published": <unix time>,
     "tenants": {tenant id: user samples trained since the previous version},
     "tenants_total": {tenant id: user samples trained since the first step}}

v0, the base model the publisher publishes first, was trained on no one's samples. Weights are never
un-trained: a tenant forgotten after version N still counts in N's and every later version's
tenants_total, which is what `versions_for` reads to say which versions saw a tenant's data (to retire them,
or to retrain from a version before it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DIR = "provenance"


def _path(trainer_dir: Path, version: int) -> Path:
    return Path(trainer_dir) / DIR / f"v{version}.json"


def read_all(trainer_dir: Path) -> list[dict]:
    """Every version's provenance this trainer directory holds, oldest version first."""
    files = [p for p in (Path(trainer_dir) / DIR).glob("v*.json") if p.stem[1:].isdigit()]
    return [json.loads(p.read_text()) for p in sorted(files, key=lambda p: int(p.stem[1:]))]


def write(trainer_dir: Path, version: int, step: int, totals: dict[str, int], published: float | None = None) -> dict:
    """Version `version`'s provenance, from the cumulative user samples trained by tenant (`totals`): its
    `tenants` are what grew since the newest version before it. Written atomically; returns the record."""
    before = [r for r in read_all(trainer_dir) if r["version"] < version]
    prev = before[-1]["tenants_total"] if before else {}
    since = {t: n - prev.get(t, 0) for t, n in sorted(totals.items()) if n > prev.get(t, 0)}
    record = {
        "version": int(version),
        "step": int(step),
        "published": time.time() if published is None else float(published),
        "tenants": since,
        "tenants_total": {t: int(n) for t, n in sorted(totals.items()) if n > 0},
    }
    path = _path(trainer_dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return record


def versions_for(trainer_dir: Path, tenant_ids: set[str]) -> list[dict]:
    """The versions whose weights saw any of these tenants' samples (tenants_total > 0), oldest first, each
    with those tenants' counts only: {"version", "step", "published", "tenants", "tenants_total"}."""
    out = []
    for r in read_all(trainer_dir):
        total = {t: n for t, n in r["tenants_total"].items() if t in tenant_ids and n > 0}
        if total:
            since = {t: r["tenants"].get(t, 0) for t in total}
            out.append(
                {
                    "version": r["version"],
                    "step": r["step"],
                    "published": r["published"],
                    "tenants": since,
                    "tenants_total": total,
                }
            )
    return out
