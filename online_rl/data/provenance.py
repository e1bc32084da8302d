"""Which tenants' samples each published version was trained on.

For each version it publishes (online_rl.trainer.publisher), the trainer writes `<work_dir>/provenance/v<N>.json`
(atomically):

    {"version": N, "step": S, "published": <unix time>,
     "tenants": {tenant id: user samples trained since the previous version},
     "tenants_total": {tenant id: user samples trained since the first step},
     "distilled": {tenant id: students' samples of its commented contexts trained since the previous version},
     "distilled_total": {tenant id: the same, since the first step}}

v0, the base model the publisher publishes first, was trained on no one's samples. Weights are never
un-trained: a tenant forgotten after version N still counts in N's and every later version's totals, which is
what `versions_for` reads to say which versions saw a tenant's data (to retire them, or to retrain from a
version before it). Records written before distillation was counted have no "distilled" keys.

No version without its record: before the store commit the publisher writes `pending.json` (the step and the
totals it is about to publish; a failure there fails the publish, nothing committed), after it v<N>.json, and
then removes pending.json. A version committed without its record (a crash between the two, a failed write)
gets one at the next publish or start (`reconcile`): the first version the store holds past the newest record
takes pending.json's totals; any other, a record {"version": N, "unknown": true, "why": ...}. A record that
cannot be read is reported and taken as unknown. versions_for lists every unknown version, whatever the
tenant (see there).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from infra.files import write_durably

log = logging.getLogger(__name__)
DIR = "provenance"
PENDING = "pending.json"
COUNTS = ("tenants", "tenants_total", "distilled", "distilled_total")


def _path(trainer_dir: Path, version: int) -> Path:
    return Path(trainer_dir) / DIR / f"v{version}.json"


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path, json.dumps(obj, sort_keys=True).encode())


def _counts(obj) -> bool:
    return isinstance(obj, dict) and all(isinstance(t, str) and isinstance(n, int) for t, n in obj.items())


def unknown(version: int, why: str, step: int | None = None, published: float | None = None) -> dict:
    """The record of a version whose samples are not known: every count empty."""
    r = {"version": int(version), "step": step, "published": published, "unknown": True, "why": why}
    return r | {k: {} for k in COUNTS}


def _grown(prev: dict, totals: dict[str, int], distilled: dict[str, int] | None) -> dict:
    """The counts of a record whose cumulative totals are these, after the record `prev` ({}: none)."""
    out = {}
    for key, now in (("tenants", totals), ("distilled", distilled or {})):
        was = prev.get(f"{key}_total", {})
        out[key] = {t: int(n - was.get(t, 0)) for t, n in sorted(now.items()) if n > was.get(t, 0)}
        out[f"{key}_total"] = {t: int(n) for t, n in sorted(now.items()) if n > 0}
    return out


def _newest_known(records, before: int | None = None) -> dict:
    usable = [r for r in records if not r.get("unknown") and (before is None or r["version"] < before)]
    return usable[-1] if usable else {}


def _read(path: Path, version: int) -> dict:
    """A record file, or an unknown record saying why it cannot be used (reported)."""
    try:
        r = json.loads(path.read_text())
        if not (isinstance(r, dict) and r.get("version") == version):
            raise ValueError("not a provenance record of this version")
        if r.get("unknown"):
            return unknown(version, str(r.get("why", "recorded unknown")), r.get("step"), r.get("published"))
        if not (isinstance(r.get("step"), int) and isinstance(r.get("published"), (int, float))):
            raise ValueError("no step or published time")
        if not all(_counts(r.get(k, {})) for k in COUNTS):
            raise ValueError("counts that are not {tenant: int}")
        return {k: {} for k in COUNTS} | r
    except (OSError, ValueError) as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        log.warning("provenance %s is damaged (%s): v%d is taken as trained on unknown samples", path, e, version)
        return unknown(version, f"damaged record: {type(e).__name__}: {str(e)[:200]}")


def read_all(trainer_dir: Path) -> list[dict]:
    """Every version's record this trainer directory holds, oldest version first; a damaged one is reported
    and given as unknown ({"version": N, "unknown": True, "why": ...}, every count empty)."""
    files = [p for p in (Path(trainer_dir) / DIR).glob("v*.json") if p.stem[1:].isdigit()]
    return [_read(p, int(p.stem[1:])) for p in sorted(files, key=lambda p: int(p.stem[1:]))]


def write(
    trainer_dir: Path,
    version: int,
    step: int,
    totals: dict[str, int],
    published: float | None = None,
    distilled: dict[str, int] | None = None,
) -> dict:
    """Version `version`'s record, from the cumulative user samples (`totals`) and distilled samples trained
    by tenant: its "tenants" and "distilled" are what grew since the newest known version before it. Written
    atomically; returns the record."""
    when = time.time() if published is None else float(published)
    record = {"version": int(version), "step": int(step), "published": when}
    record |= _grown(_newest_known(read_all(trainer_dir), version), totals, distilled)
    _write_json(_path(trainer_dir, version), record)
    return record


def write_pending(
    trainer_dir: Path, step: int, totals: dict[str, int], distilled: dict[str, int], after: int | None
) -> None:
    """Before a publish commits: the step and totals of the version it makes, the first past `after` (the
    newest version the store held then)."""
    pending: dict[str, object] = {"step": int(step), "after": -1 if after is None else int(after)}
    pending |= {"tenants_total": dict(totals), "distilled_total": dict(distilled)}
    _write_json(Path(trainer_dir) / DIR / PENDING, pending)


def read_pending(trainer_dir: Path) -> dict | None:
    path = Path(trainer_dir) / DIR / PENDING
    try:
        p = json.loads(path.read_text())
        if not (isinstance(p.get("step"), int) and isinstance(p.get("after"), int)):
            raise ValueError("not a pending provenance record")
        if not (_counts(p.get("tenants_total")) and _counts(p.get("distilled_total"))):
            raise ValueError("not a pending provenance record")
        return p
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as e:
        log.warning("provenance %s is damaged (%s): versions published without a record are unknown", path, e)
        return None


def clear_pending(trainer_dir: Path) -> None:
    (Path(trainer_dir) / DIR / PENDING).unlink(missing_ok=True)


def reconcile(
    trainer_dir: Path, versions: list[int], published_at: Callable[[int], float | None] = lambda v: None
) -> list[tuple[int, int | None]]:
    """Records for the store's `versions` past the newest record here (committed, their records never
    written): v0 is the base model; the first past pending.json's takes its totals; any other is unknown.
    A directory with neither records nor pending.json has published nothing: the store's versions are not
    its own (a new work directory), and none is recorded. Returns the (version, step) recorded, step None
    where unknown."""
    records, pending = read_all(trainer_dir), read_pending(trainer_dir)
    done: list[tuple[int, int | None]] = []
    if records:
        newest = records[-1]["version"]
    elif pending is not None:
        newest = pending["after"]
    else:
        return []
    for v in sorted(x for x in versions if x > newest):
        if v == 0:
            write(trainer_dir, 0, 0, {}, published_at(0))
            done.append((0, 0))
        elif pending is not None and pending["after"] < v:
            t, d = pending["tenants_total"], pending["distilled_total"]
            write(trainer_dir, v, pending["step"], t, published_at(v), d)
            done.append((v, pending["step"]))
            pending = None
        else:
            _write_json(_path(trainer_dir, v), unknown(v, "published without a record", published=published_at(v)))
            done.append((v, None))
        log.warning("provenance of v%d recorded after its publish (step %s)", v, done[-1][1])
    if done and pending is None:
        clear_pending(trainer_dir)
    return done


def _markers(trainer_dir: Path) -> dict[int, tuple[int, float]]:
    """version -> (step, when) of the versions the publisher's published/step-*/PUBLISHED name (its newest)."""
    out = {}
    for p in (Path(trainer_dir) / "published").glob("step-*/PUBLISHED"):
        try:
            out[int(p.read_text())] = (int(p.parent.name.split("-")[1]), p.stat().st_mtime)
        except (OSError, ValueError, IndexError):
            continue
    return out


def versions_for(trainer_dir: Path, tenant_ids: set[str]) -> list[dict]:
    """The versions whose weights saw, or may have seen, any of these tenants' samples, oldest first:

        {"version", "step", "published", "tenants", "tenants_total", "distilled", "distilled_total"}

    with those tenants' counts only, for each version whose record counts them (tenants_total or
    distilled_total above 0). Conservative where records fail: a version without a usable record (damaged,
    recorded unknown, or missing between the versions this directory knows, the publisher's newest markers
    included) is listed for every tenant, as {..., "unknown": True, "why": ...} with every count empty and
    its step and published time where known (else None); and a publish not yet confirmed (pending.json, past
    every record: it may or may not have committed) is listed with its counts as the version it would be,
    "unknown": True, published None (without the "unknown" once the publisher's marker confirms it). Versions
    before this directory's oldest record are not known here."""
    every = read_all(trainer_dir)
    records, markers, pending = {r["version"]: r for r in every}, _markers(trainer_dir), read_pending(trainer_dir)
    # the publish pending.json was written for: the newest, if its version has no record yet
    ahead = pending["after"] + 1 if pending is not None else None
    if ahead is not None and ahead <= max(records, default=-1):
        ahead = None
    known = set(records) | set(markers) | ({ahead} if ahead is not None else set())
    out = []
    for v in range(min(known, default=0), max(known, default=-1) + 1):
        step, when = markers.get(v, (None, None))
        r = records.get(v)
        if v == ahead and pending is not None and step in (None, pending["step"]):
            counts = _grown(_newest_known(every), pending["tenants_total"], pending["distilled_total"])
            entry = _entry({"version": v, "step": pending["step"], "published": when} | counts, tenant_ids)
            if entry and step is None:  # no marker of it: the commit may not have happened
                entry |= {"unknown": True, "why": "publish not confirmed: the version may not exist"}
            out += [entry] if entry else []
        elif r is None or r.get("unknown"):
            if v != 0:  # v0 is the base model
                why = r["why"] if r else "no provenance record"
                out.append(unknown(v, why, step, when if r is None or r["published"] is None else r["published"]))
        elif entry := _entry(r, tenant_ids):
            out.append(entry)
    return out


def _entry(r: dict, ids: set[str]) -> dict | None:
    """A record's entry for these tenants, None when it counts none of them."""
    entry = {"version": r["version"], "step": r["step"], "published": r["published"]}
    for key in ("tenants", "distilled"):
        total = {t: n for t, n in r.get(f"{key}_total", {}).items() if t in ids and n > 0}
        entry[key] = {t: r.get(key, {}).get(t, 0) for t in total}
        entry[f"{key}_total"] = total
    return entry if entry["tenants_total"] or entry["distilled_total"] else None
