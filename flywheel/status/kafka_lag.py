"""`flywheel status`: consumer lag of the trainer's and the weight agents' Kafka groups (flywheel.status.gather).

Lag of a partition is its log end offset minus the group's committed offset. A partition the group is
meant to read (the trainer: completions, feedback, weights, tenants; an agent: weights) but has no committed
offset for counts from the partition's first offset: all of it is still to be read. The trainer commits
only together with a checkpoint (online_rl.data.reader), so its lag is what a restart would read again.
"""

from __future__ import annotations

from contracts import events as ev
from flywheel.status.sources import Unexpected
from infra import kafka_auth
from online_rl.data import reader as stream_reader

TRAINER_TOPICS = stream_reader.TOPICS
AGENT_TOPICS = (ev.TOPIC_WEIGHTS,)  # weight_sync.agent.loop follows the weights topic only


def _text(e: BaseException) -> str:
    text = " ".join(str(e).split())[:160]
    return text if text.startswith(type(e).__name__) else f"{type(e).__name__}: {text}".rstrip(": ")


def _role(group: str, trainer_group: str, agent_prefix: str) -> str:
    if group == trainer_group:
        return "trainer"
    return "agent" if group.startswith(agent_prefix) else "other"


def consumer_lag(bootstrap: str, trainer_group: str, agent_prefix: str, timeout_s: float) -> dict:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient, OffsetSpec

    from infra.kafka_admin import quiet_kafka

    ms = max(1000, int(timeout_s * 1000))
    with quiet_kafka():
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                **kafka_auth.client_config(),
                client_id="flywheel-status",
                bootstrap_timeout_ms=ms,
                request_timeout_ms=ms,
            )
        except Exception as e:
            why = f"no broker answered within {ms / 1000:g} s" if "bootstrap" in str(e).lower() else _text(e)
            raise Unexpected(f"cannot reach Kafka at {bootstrap}: {why}") from None
        try:
            listed = {g["group_id"]: g for g in admin.list_groups()}
            committed = admin.list_group_offsets({g: None for g in listed}) if listed else {}
            expected = {"trainer": TRAINER_TOPICS, "agent": AGENT_TOPICS, "other": ()}
            topics = sorted({t for g in listed for t in expected[_role(g, trainer_group, agent_prefix)]})
            partitions = {
                t["name"]: [p["partition_index"] for p in t["partitions"]]
                for t in (admin.describe_topics(topics) if topics else [])
                if not t.get("error_code")
            }
            wanted: dict[str, set] = {}
            for g in listed:
                tps = set(committed.get(g, {}))
                for t in expected[_role(g, trainer_group, agent_prefix)]:
                    tps.update(TopicPartition(t, p) for p in partitions.get(t, []))
                wanted[g] = tps
            every = set().union(*wanted.values()) if wanted else set()
            ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in every}) if every else {}
            starts = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in every}) if every else {}
        except Exception as e:
            raise Unexpected(f"Kafka at {bootstrap}: {_text(e)}") from None
        finally:
            admin.close()
    groups = []
    for g, info in sorted(listed.items()):
        by_topic: dict[str, int] = {}
        uncommitted = 0
        for tp in wanted[g]:
            c = committed.get(g, {}).get(tp)
            offset = c.offset if c is not None and c.offset >= 0 else None
            if offset is None:
                uncommitted += 1
                offset = starts[tp].offset
            by_topic[tp.topic] = by_topic.get(tp.topic, 0) + max(0, ends[tp].offset - offset)
        groups.append(
            {
                "group": g,
                "role": _role(g, trainer_group, agent_prefix),
                "state": info.get("group_state"),
                "lag": sum(by_topic.values()),
                "by_topic": dict(sorted(by_topic.items())),
                "uncommitted_partitions": uncommitted,
            }
        )
    order = {"trainer": 0, "agent": 1, "other": 2}
    groups.sort(key=lambda r: (order[r["role"]], r["group"]))
    return {
        "bootstrap": bootstrap,
        "groups": groups,
        "trainer_group": trainer_group if trainer_group in listed else None,
        "trainer_group_id": trainer_group,
        "agents": sum(r["role"] == "agent" for r in groups),
    }
