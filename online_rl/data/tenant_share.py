"""No tenant fills a training batch: its user samples take at most `max_tenant_share` of a batch's places
(`batch_size`), so a tenant that floods the stream with judged completions steers each update no more than that
share, and the other tenants' samples are not pushed out (or left to go stale) behind its flood.

    fresh samples, in stream order --> batch: each tenant's first floor(share x batch_size) (at least 1),
                                       rollouts and distilled samples as before, up to batch_size
                                   --> waiting: the rest, in order, for the next batch
                                   --> dropped: a capped tenant's oldest waiting samples past max_tenant_backlog
                                       (counted: flywheel_trainer_dropped_total{reason="tenant_share"}, ledgered)

Over the cap a sample waits first, then is dropped: the wait is bounded per tenant by max_tenant_backlog, and as
for every buffered sample by the staleness bound (online_rl.trainer.loop). A tenant is a name where the tenants topic
gave one (every key of it is one tenant), else its key id. A batch whose fresh user samples are all one tenant's
is not capped: there is nobody to push out, and a smaller batch of the same samples would only mean more
updates on them, not less say.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from online_rl.data.samples import Sample


def take(
    fresh: list[Sample], batch_size: int, share: float, backlog: int, tenant_of: Callable[[str], str]
) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """(the batch, the samples left waiting in order, the samples dropped)."""
    tenants = {tenant_of(s.tenant) for s in fresh if s.source == "user"}
    if share >= 1 or len(tenants) < 2:
        return fresh[:batch_size], fresh[batch_size:], []
    cap = max(1, math.floor(share * batch_size))
    taken: dict[str, int] = {}
    capped: set[str] = set()
    batch: list = []
    waiting: list = []
    for s in fresh:
        who = tenant_of(s.tenant) if s.source == "user" else None
        if len(batch) >= batch_size:
            waiting.append(s)
        elif who is not None and taken.get(who, 0) >= cap:
            capped.add(who)
            waiting.append(s)
        else:
            batch.append(s)
            if who is not None:
                taken[who] = taken.get(who, 0) + 1
    if not capped:
        return batch, waiting, []
    left = {who: sum(s.source == "user" and tenant_of(s.tenant) == who for s in waiting) for who in capped}
    dropped, kept = [], []
    for s in waiting:  # oldest first: the newest samples are the closest to the current policy
        who = tenant_of(s.tenant) if s.source == "user" else None
        if who in capped and left[who] > backlog:
            left[who] -= 1
            dropped.append(s)
        else:
            kept.append(s)
    return batch, kept, dropped


def take_batch(trainer, fresh: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """The trainer's next batch and what stays buffered (online_rl.trainer.loop.Trainer._take_batch); the samples
    dropped are counted and ledgered."""
    c = trainer.cfg

    def name(tenant: str) -> str:
        return trainer.privacy.policies.get(tenant, {}).get("name") or tenant

    batch, waiting, dropped = take(fresh, c.batch_size, c.max_tenant_share, c.max_tenant_backlog, name)
    for s in dropped:
        trainer.metrics.dropped.labels("tenant_share").inc()
        trainer._ledger(s, "tenant_share")
    return batch, waiting
