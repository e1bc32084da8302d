"""A tenant policy cannot be loosened by a stale gateway: gateway A sets a tenant to `train: deny` through its
admin API; gateway B, restarted on a keys file copied before that (train: allow), re-announces what it read
on start. Both ship to a real broker; the trainer's reader (online_rl.data.reader) and tenant gate
(online_rl.data.tenants) read the tenants topic as the trainer does, and the tenant stays denied: its events are
refused, never trained on."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from prometheus_client import CollectorRegistry

from contracts import events as ev
from flywheel.kafka import broker as kafka_broker
from infra.kafka_admin import ensure_topics
from serving import auth
from tests.fake_engine import gateway_over_fakes
from tests.helpers import events_until, read_topic

pytestmark = pytest.mark.timeout(300)
ADMIN = {"Authorization": "Bearer admin-secret"}


def test_a_stale_gateway_restart_cannot_loosen_a_deny(test_model, tmp_path):
    from online_rl.data.reader import StreamReader
    from online_rl.data.tenants import TenantGate

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    readers = []
    try:
        ensure_topics(broker.bootstrap)
        keys_a = tmp_path / "a" / "keys.json"
        auth.add_key(keys_a, "acme")
        auth.set_policy(keys_a, "acme", train="allow", retention_days=30)  # a policy B's copy will hold
        keys_b = tmp_path / "b" / "keys.json"
        keys_b.parent.mkdir()
        shutil.copy(keys_a, keys_b)  # B's copy, soon stale
        (tid,) = auth.KeyStore.load(keys_a).tenants()["acme"]

        def acme_records(n: int) -> list:
            return [
                r
                for r in events_until(
                    broker.bootstrap,
                    ev.TOPIC_TENANTS,
                    lambda rs: len([r for r in rs if r.tenant == tid]) >= n,
                )
                if r.tenant == tid
            ]

        async def gateway(name: str, keys, scenario):
            async with gateway_over_fakes(
                test_model,
                tmp_path / name / "state",
                [1],
                tenants=0,
                keys_file=keys,
                log_events=True,
                kafka_bootstrap=broker.bootstrap,
            ) as (client, _fakes):
                return await scenario(client)

        async def deny(client):
            r = await client.put("/admin/tenants/acme", json={"train": "deny"}, headers=ADMIN)
            assert r.status == 200, await r.text()
            await asyncio.to_thread(acme_records, 2)  # A's start (allow) and its deny are on the topic

        async def restart(client):  # B starts on its stale file and re-announces what it holds
            await asyncio.to_thread(acme_records, 3)

        asyncio.run(gateway("a", keys_a, deny))
        asyncio.run(gateway("b", keys_b, restart))
        on_topic = acme_records(3)
        assert [r.train for r in on_topic][-2:] == ["deny", "allow"]  # the stale allow came last

        def trainer_reads(group: str, n: int) -> TenantGate:
            """The trainer's reading of the topic: from the beginning, in order, as at a first start."""
            gate = TenantGate(registry=CollectorRegistry())
            reader = StreamReader(broker.bootstrap, group, poll_ms=200)
            readers.append(reader)
            seen = 0
            for _ in range(100):
                for topic, value in reader.read(reader.fetch()):
                    if topic == ev.TOPIC_TENANTS:
                        gate.record(value)
                        seen += 1
                if seen >= n:
                    break
            assert seen >= n
            return gate

        gate = trainer_reads("stale-gateway", len(on_topic))
        assert gate.policies[tid]["train"] == "deny", gate.policies[tid]
        late = ev.FeedbackEvent(completion_id="cmpl-x", choice_index=0, tenant=tid, kind="accept")
        assert gate.refuse(late) == "deny"  # what the trainer would have learned from: refused
        assert gate.stale_records._value.get() >= 1

        # The broker compacts the topic (it keeps the newest record of each key), then a trainer starts from
        # nothing. Keyed by tenant alone, the stale allow would be all that is left of acme.
        def acme_now() -> list:
            records = (ev.decode(v) for _, v in read_topic(broker.bootstrap, ev.TOPIC_TENANTS))
            return [r for r in records if r.tenant == tid]

        _compact(broker.bootstrap, ev.TOPIC_TENANTS, lambda: len(acme_now()) < len(on_topic))
        (allow, deny, stale) = on_topic[-3:]
        assert allow.version == stale.version < deny.version
        assert [(r.train, r.version) for r in acme_now()] == [("deny", deny.version), ("allow", stale.version)]
        gate = trainer_reads("after-compaction", 2)
        assert gate.policies[tid]["train"] == "deny", gate.policies[tid]
    finally:
        for reader in readers:
            reader.close()
        assert broker.stop()


def _compact(bootstrap: str, topic: str, done, timeout_s: float = 90.0) -> None:
    """Have the broker compact `topic` now, until done() holds: its cleaner runs every 200 ms (a dynamic broker
    setting) and a segment rolls after 100 ms; one more record (another tenant's) rolls the segment holding the
    records so far, and the cleaner never cleans the segment being written."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    from infra import kafka_auth
    from online_rl.data.simulate import produce

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **kafka_auth.client_config())
    try:
        admin.alter_configs(  # a whole topic's settings: the compaction it was made with among them
            [
                ConfigResource(ConfigResourceType.BROKER, "1", {"log.cleaner.backoff.ms": "200"}),  # its only node
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    {
                        "cleanup.policy": "compact",
                        "retention.ms": "-1",
                        "segment.ms": "100",
                        "min.cleanable.dirty.ratio": "0.001",
                    },
                ),
            ]
        )
    finally:
        admin.close()
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the broker did not compact the topic"
        filler = ev.TenantRecord(tenant="filler", name="filler")
        produce(bootstrap, [(topic, filler.key, filler.encode())])
        time.sleep(0.5)
