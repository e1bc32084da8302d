"""No tenant fills a training batch: a tenant flooding the stream with judged completions gets at most its share
of each batch, the other tenants' samples go in first, and its excess waits, then is dropped and counted. The
events go through the real join (online_rl.data.join.Joiner) and the trainer's own batch assembly
(online_rl.trainer.loop.Trainer._take_batch, on the parts of a trainer it reads: no model is loaded)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter

from contracts import events as ev
from online_rl.config import TrainerConfig
from online_rl.data.join import Joiner
from online_rl.data.tenants import TenantGate
from online_rl.trainer.loop import Trainer
from tests.helpers import completion_event


def judged(tenant: str, i: int, ts: float) -> list:
    cid = f"cmpl-{tenant}-{i}"
    c = completion_event(cid, ts, tenant=tenant)
    return [c, ev.FeedbackEvent(completion_id=cid, choice_index=0, tenant=tenant, kind="accept", ts=ts)]


def samples_of(counts: dict[str, int]) -> list:
    """The joined samples of `counts` judged completions per tenant, the flood's written first."""
    j = Joiner()
    out, ts = [], 1000.0
    for tenant, n in counts.items():
        for i in range(n):
            ts += 0.001
            for e in judged(tenant, i, ts):
                out += j.add(ev.decode(e.encode()))
    return out


def trainer(**cfg):
    """What of the trainer its batch assembly uses: config, tenants' policies, dropped counter, ledger."""
    ledger, config = [], TrainerConfig(model_dir=None)
    for k, v in cfg.items():
        setattr(config, k, v)
    return SimpleNamespace(
        cfg=config,
        privacy=TenantGate(CollectorRegistry()),
        metrics=SimpleNamespace(dropped=Counter("d", "", ["reason"], registry=CollectorRegistry())),
        _ledger=lambda s, why=None: ledger.append((s.key, why)),
        _problem=lambda s: None,
        ledger=ledger,
        rolled_back=set(),
        version=0,
        buffer=[],
    )


def take_batch(t, fresh):
    """The trainer's next batch from `fresh` as its buffer, and what stays buffered."""
    t.buffer = list(fresh)
    batch = Trainer._take_batch(t)
    return batch, t.buffer


def per_tenant(samples) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in samples:
        out[s.tenant] = out.get(s.tenant, 0) + 1
    return out


def test_a_flooding_tenant_takes_at_most_its_share_and_the_others_go_in():
    t = trainer(batch_size=32, max_tenant_share=0.25, max_tenant_backlog=40)
    fresh = samples_of({"flood": 300, "b": 6, "c": 5})
    batch, waiting = take_batch(t, fresh)
    assert per_tenant(batch) == {"flood": 8, "b": 6, "c": 5}
    assert per_tenant(waiting) == {"flood": 40}  # waits, bounded; the oldest past the bound dropped
    dropped = [k for k, why in t.ledger if why == "tenant_share"]
    assert len(dropped) == 300 - 8 - 40 and t.metrics.dropped.labels("tenant_share")._value.get() == len(dropped)
    assert [s.key for s in waiting] == [f"cmpl-flood-{i}:0" for i in range(260, 300)]  # the newest wait
    # The next batch, the flood alone: nobody to push out, not capped.
    batch2, waiting2 = take_batch(t, waiting)
    assert len(batch2) == 32 and len(waiting2) == 8


def test_a_tenants_keys_are_one_tenant_once_its_name_is_known():
    t = trainer(batch_size=16, max_tenant_share=0.25)
    for key_id in ("k1", "k2", "k3"):
        t.privacy.record(ev.TenantRecord(tenant=key_id, name="big", train="allow"))
    fresh = samples_of({"k1": 10, "k2": 10, "k3": 10, "small": 3})
    batch, _ = take_batch(t, fresh)
    counts = per_tenant(batch)
    assert counts.pop("small") == 3 and sum(counts.values()) == 4  # three keys, one share of 16 / 4


def test_no_cap_when_the_share_is_one_or_for_rollouts():
    fresh = samples_of({"a": 20, "b": 2})
    batch, waiting = take_batch(trainer(batch_size=16, max_tenant_share=1.0), fresh)
    assert len(batch) == 16 and len(waiting) == 6
    for s in fresh[:10]:
        s.source = "rollout"
    batch, waiting = take_batch(trainer(batch_size=16, max_tenant_share=0.25), fresh)
    assert per_tenant(batch) == {"a": 14, "b": 2}  # 10 rollouts + 4 of a's user samples
