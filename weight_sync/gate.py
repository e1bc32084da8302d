"""The eval gate's side in weight_sync: a version published but held back from the weights topic until the gate
(online_rl.gate) has judged it. Its verdict is a signed `gate` record on the weights topic and a line in the
store's activations (`flywheel weights list`); a pass announces the version, a block leaves it in the store
unannounced, and an SRE's override (`flywheel weights gate-override N`) records who and why, then announces it.

    publish(..., announce_now=False)  ->  online_rl.gate judges it  ->  decide(pass)   -> gate record, then version
                                                                    ->  decide(block)  -> gate record only
    flywheel weights gate-override N  ->  gate record (override, by, reason), then version
"""

from __future__ import annotations

import dataclasses
import getpass

from weight_sync.publish import PublishConfig, activate, announce, stored_announcement
from weight_sync.store.server import Store


def decide(cfg: PublishConfig, version: int, verdict: str, reason: str, baseline: int, figures: dict) -> dict:
    """Record the gate's verdict on `version` (signed, on the weights topic and in the store), then announce
    the version if it passed. Returns the gate record."""
    if verdict not in ("pass", "block"):
        raise ValueError(f"a gate decides pass or block, not {verdict!r}")
    # canary: how the version is announced, now or after an override (a canary candidate or for everyone)
    record = activate(
        cfg, version, reason, "gate", verdict=verdict, stable=baseline, figures=figures, canary=bool(cfg.canary)
    )
    if verdict == "pass":
        announce(cfg, stored_announcement(cfg, version))
    return record


def override(cfg: PublishConfig, version: int, reason: str, by: str | None = None, force: bool = False) -> dict:
    """An SRE releases a version the gate blocked: a signed gate record saying who and why, then the version's
    announcement (a canary candidate if the block says it was to be one). Returns the gate record. A block older
    than the newest version sent is refused unless `force`: released for everyone, it would take the fleet back."""
    store = Store(cfg.store)
    if version not in store.versions():
        raise ValueError(f"version {version} is not in the store (have {store.versions()})")
    last = store.gate_verdicts().get(version)
    if last is None or last.get("verdict") != "block":
        state = "no gate verdict" if last is None else f"gate verdict {last.get('verdict')!r}"
        raise ValueError(f"v{version} is not blocked by the gate ({state}): nothing to override")
    if not reason.strip():
        raise ValueError("an override needs a reason (--reason)")
    who = by or getpass.getuser()
    canary = bool(last.get("canary", cfg.canary))  # announced as the trainer would have, had it passed
    sent = store.announced()
    if sent is not None and version < sent and not canary and not force:
        raise ValueError(
            f"v{version} is older than v{sent}, the newest version sent to the fleet: releasing it would take every "
            "replica back to it (to roll back on purpose: flywheel weights rollback; to release it anyway: --force)"
        )
    record = activate(
        cfg, version, reason, "gate", verdict="override", by=who, stable=last.get("stable", version), canary=canary
    )
    announce(cfg, stored_announcement(dataclasses.replace(cfg, canary=canary), version))
    return record
