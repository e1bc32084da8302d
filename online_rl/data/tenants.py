"""Tenants' privacy in the training loop: which events and samples the trainer may learn from.

The gateway puts each tenant's policy on the tenants topic (contracts.events.TenantRecord, keyed by the
tenant id and version, compacted): the record of a tenant's highest version is its policy. The trainer reads
that topic with the others, from its checkpoint's offsets (online_rl.data.reader), and gives every record to
`TenantGate.record`.
Before the Joiner holds an event, `TenantGate.refuse` says why it must not (None: it may):

    withheld   the event carries no content (its tenant denies training, or a secret was scrubbed from it).
               A completion so never becomes a sample; a withheld comment never becomes a hint (its text is
               gone). A judgment (accept, reject, partial) or a persisted check carries no content: one
               withheld for a secret still joins its completion when that completion was not withheld (the
               scrubber found the secret in the comment, never in a judgment); one withheld by policy is
               refused, its tenant denying training.
    deny       the tenant's newest policy is train: deny (it may come after the events: the newest known wins).
    forgotten  `flywheel tenants forget`: an event of the tenant written at or before forgotten_before.
    retention  an event older than the tenant's retention_days, measured against wall time when it is read
               (and again before each update): retention is a promise in calendar time, and a trainer that
               was down for a week must not learn from what aged out meanwhile.

A record that makes a tenant denied, or moves its forgotten_before later, also drops what the trainer already
holds of it (`purge`): the Joiner's waiting completions, turns, held samples, orphan and session feedback
(stream.Joiner.drop_tenant), the buffered samples (each in the next checkpoint's ledger as dropped, with its
reason) and the commented contexts waiting to be distilled again (Trainer.drop_samples). Every drop is
counted in flywheel_trainer_privacy_dropped_total{reason} (events refused or dropped, samples and contexts
dropped) and each purge is logged once. After a purge, `purged` stays set until a checkpoint is written
without any older one beside it (online_rl.trainer.checkpoints): the checkpoints from before held the tenant's
token ids and events. Weights already trained are not un-trained: online_rl.data.provenance says which published
versions saw a tenant's samples, and the students' samples of its commented contexts (`distilled`).
A record on the tenants topic that is not a tenant policy is skipped, logged and counted
(flywheel_trainer_privacy_bad_records_total; in the trainer its reader refuses it first: online_rl.data.reader).
Policies are versioned (serving.auth.Policy.version): a record of
a lower version than the tenant's policy in effect (a gateway restarted on a stale keys file re-announcing what
it read) changes nothing but a later forgotten_before, and is counted (flywheel_trainer_privacy_stale_records_total).

The gate's state (policies, forgotten_before, user and distilled samples trained by tenant) goes into the
trainer's checkpoint, as plain values. Ids already joined (the Joiner's judged keys and seen event ids) hold
no content and stay: they only keep a redelivered event from being counted twice. Samples from a checkpoint
written before tenants carry no tenant: no policy applies to them (the trainer warns at resume).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from contracts import events as ev
from online_rl.data.samples import DISTILL

log = logging.getLogger(__name__)
REASONS = ("withheld", "deny", "forgotten", "retention")
DAY_S = 86400.0


class TenantGate:
    """The tenants' policies, what they refuse, and the user samples trained by tenant.

    holder: what holds a tenant's data in the trainer (online_rl.trainer.loop.Trainer): its `joiner` and
    `drop_samples(gone, reason) -> (samples, contexts)`, which drops the buffered samples and commented contexts
    `gone(sample)` says and ledgers the samples. None: refuse only, nothing to purge.
    """

    def __init__(self, registry: CollectorRegistry | None = None, holder=None, clock: Callable[[], float] = time.time):
        self.holder, self.clock = holder, clock
        # tenant -> {"name", "train", "retention_days", "forgotten_before", "ts", "version"}: its record of the
        # highest policy version (a tie: the later one), except forgotten_before, which only grows (a record that
        # lost it cannot bring forgotten events back)
        self.policies: dict[str, dict] = {}
        self.trained: dict[str, int] = {}  # user samples trained, by tenant, since the first step (provenance)
        self.distilled: dict[str, int] = {}  # students' samples of commented contexts trained, by tenant
        self.purged = False  # a purge since the last checkpoint that stands alone (Trainer.save)
        registry = registry if registry is not None else CollectorRegistry()
        self.bad_records = Counter(
            "flywheel_trainer_privacy_bad_records",
            "Records on the tenants topic that are not a tenant policy (skipped)",
            registry=registry,
        )
        self.stale_records = Counter(
            "flywheel_trainer_privacy_stale_records",
            "Tenant policies older (by version) than the one in effect, e.g. re-announced by a gateway on a stale "
            "keys file: only a later forgotten_before in one is taken",
            registry=registry,
        )
        self.dropped = Counter(
            "flywheel_trainer_privacy_dropped",
            "Events and samples of tenants never trained on, by reason (withheld: no content; deny: the tenant's "
            "policy; forgotten: flywheel tenants forget; retention: older than the tenant's retention_days)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:  # at 0 from the start: an alert on its increase sees the first one
            self.dropped.labels(reason)

    # ------------------------------------------------------------------ what is refused
    def policy_refuses(self, tenant: str, ts: float) -> str | None:
        """Why the tenant's newest policy refuses what it wrote at `ts` (None: it allows it)."""
        p = self.policies.get(tenant)
        if p is None:
            return None
        if p["train"] == "deny":
            return "deny"
        if p["forgotten_before"] is not None and ts <= p["forgotten_before"]:
            return "forgotten"
        if p["retention_days"] is not None and ts and self.clock() - ts > p["retention_days"] * DAY_S:
            return "retention"
        return None

    def refuse(self, event) -> str | None:
        """Why a completion or feedback event must never be held or trained on (counted), or None."""
        w = getattr(event, "withheld", "")
        why: str | None
        if w and (isinstance(event, ev.CompletionEvent) or w == "policy" or event.kind == "comment"):
            why = "withheld"
        else:
            why = self.policy_refuses(event.tenant, event.ts)
        if why is not None:
            self.dropped.labels(why).inc()
        return why

    def refuse_sample(self, s) -> str | None:
        """Why a buffered user sample must not be trained now (counted), or None. Before each update: the
        policy may have changed, and retention runs on, since it was made."""
        if s.source != "user" or not s.tenant:
            return None
        why = self.policy_refuses(s.tenant, s.ts)
        if why is not None:
            self.dropped.labels(why).inc()
        return why

    def trained_on(self, s) -> None:
        """A sample went into an update: a user's, or a student's sample of a user's commented context
        (online_rl.data.distill_samples), counts towards its tenant's provenance."""
        counts = self.trained if s.source == "user" else self.distilled if s.source == DISTILL else None
        if counts is not None:
            counts[s.tenant] = counts.get(s.tenant, 0) + 1

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """(user samples, distilled samples) trained by tenant since the first step: a version's provenance."""
        return dict(self.trained), dict(self.distilled)

    # ------------------------------------------------------------------ policies
    def record(self, value) -> None:
        """Apply a tenant record (encoded, or a TenantRecord) read from the tenants topic, and purge what the
        trainer holds of a tenant that is now denied, or forgotten further. A bad record is counted, skipped."""
        try:
            r: object = value if isinstance(value, ev.TenantRecord) else ev.decode(value)
        except ev.SchemaError as e:
            r = e
        if not isinstance(r, ev.TenantRecord):
            self.bad_records.inc()
            log.warning("a record on the tenants topic that is not a tenant policy: %s", r)
            return
        old = self.policies.get(r.tenant, {"train": "allow", "forgotten_before": None})
        was = old["forgotten_before"]
        before = r.forgotten_before if was is None else max(was, r.forgotten_before or was)
        if r.version < old.get("version", 0):  # older than what is in effect: it may only forget more
            self.stale_records.inc()
            log.warning(
                "tenant %s (%s): a policy of version %d after version %d (a stale keys file?): not applied",
                r.tenant,
                r.name,
                r.version,
                old["version"],
            )
            new = {**old, "forgotten_before": None if before is None else float(before)}
        else:
            new = {
                "name": r.name,
                "train": r.train,
                "retention_days": None if r.retention_days is None else float(r.retention_days),
                "forgotten_before": None if before is None else float(before),
                "ts": float(r.ts),
                "version": r.version,
            }
        self.policies[r.tenant] = new
        if before is not None and (was is None or before > was):
            self.purge(r.tenant, before, "forgotten")
        if new["train"] == "deny" and old["train"] != "deny":
            self.purge(r.tenant, math.inf, "deny")

    def purge(self, tenant: str, before: float, reason: str) -> int:
        """Drop what the holder has of `tenant` written at or before `before` (math.inf: everything); the
        buffered samples go into the next checkpoint's ledger as dropped for `reason`. Returns the count."""
        h = self.holder
        if h is None:
            return 0

        def gone(s) -> bool:
            return s.source == "user" and s.tenant == tenant and s.ts <= before

        events = h.joiner.drop_tenant(tenant, before)
        samples, contexts = h.drop_samples(gone, reason)
        self.purged = True  # even when nothing is held now: older checkpoints may hold it
        n = events + samples + contexts
        self.dropped.labels(reason).inc(n)
        name = self.policies.get(tenant, {}).get("name") or "?"
        log.info(
            "tenant %s (%s) %s%s: dropped %d held events, %d buffered samples, %d commented contexts",
            tenant,
            name,
            reason,
            f" before {before:.3f}" if math.isfinite(before) else "",
            events,
            samples,
            contexts,
        )
        return n

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict:
        """Plain values only: checkpoints load with torch.load(weights_only=True)."""
        return {
            "policies": {t: dict(p) for t, p in self.policies.items()},
            "trained": dict(self.trained),
            "distilled": dict(self.distilled),
            # Set in the checkpoint that follows a purge: a crash before the older ones were removed, and the
            # resumed trainer's next save removes them.
            "purged": self.purged,
        }

    def load_state(self, state: dict | None, older: list | None = None) -> None:
        """`older`: the checkpoints on disk besides the one `state` came from (a purge pending while any is)."""
        state = state or {}  # checkpoints written before tenants have none
        self.policies = {t: dict(p) for t, p in state.get("policies", {}).items()}
        self.trained = dict(state.get("trained", {}))
        self.distilled = dict(state.get("distilled", {}))
        self.purged = bool(state.get("purged", False)) and bool(older)
