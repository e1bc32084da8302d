"""The highest sequence number on the weights topic signed by our key: the floor of the next one when the
store's own memory of it is gone (its counter lost or damaged; a store rebuilt on a new host beside a topic
that remembers). Read only then: in steady state the counter and the store's ledgers already are that floor.

Anyone able to write the topic could append records; only those that verify with our key count (a forged
seq of 10**18 must not push the sequence out of range). The topic's order is the sequence's order
(publishers send under the store's lock), so the newest records hold the highest number: the last WINDOW of
each partition are read. The broker unreachable raises: no number is handed out until it can be checked.
"""

from __future__ import annotations

import logging
import time

from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth

log = logging.getLogger(__name__)
WINDOW = 200  # records read back from each partition's end


def highest_seq(bootstrap: str, public_key, timeout_s: float = 15.0) -> int:
    """The highest seq of a record on the weights topic that verifies with `public_key` (0: none)."""
    from kafka import KafkaConsumer, TopicPartition

    from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS

    ms = int(timeout_s * 1000)
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        enable_auto_commit=False,
        group_id=None,
        client_id="flywheel-publisher-floor",
        request_timeout_ms=max(ms, 1000),
        bootstrap_timeout_ms=ms,  # the broker away fails this in timeout_s, as a send would
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )
    try:
        partitions = c.partitions_for_topic(TOPIC_WEIGHTS)
        if partitions is None:  # no metadata: unreachable, or not yet created (then nothing was sent)
            if not c.bootstrap_connected():
                raise ConnectionError(f"cannot reach the broker at {bootstrap} to read the weights topic")
            return 0
        tps = [TopicPartition(TOPIC_WEIGHTS, p) for p in sorted(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, max(0, ends[tp] - WINDOW))
        best, deadline = 0, time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the weights topic's last records took over {timeout_s:.0f}s")
            for records in c.poll(timeout_ms=200).values():
                for r in records:
                    try:
                        best = max(best, control.decode(r.value, public_key)["seq"])
                    except control.ControlError:
                        continue  # not ours: never a floor
        return best
    finally:
        c.close()
