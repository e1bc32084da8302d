"""What Kafka's security costs (issue #48, item 1): three brokers side by side on this machine, the same client
work against each, in alternating rounds (this machine is noisy):

    open      PLAINTEXT, no authorizer (as before #48)
    scram     SASL_PLAINTEXT: SCRAM-SHA-512 logins and ACLs
    tls       SASL_SSL: the same over TLS 1.3 (the default)

Per round and broker: a gateway-like producer (acks=all, idempotent, zstd, linger 5 ms) sends N events of
~2 KB and flushes (events/s); one record at a time, send and wait (p50 ms: the shipper's worst case, a lone
event); a consumer reads the N back from the start (events/s); a new client's first acknowledged send (connect,
login, handshake: ms); and the client's CPU per event produced (ms). Ratios are medians over rounds of
secured/open.

    python -m benchmarks.kafka_security        ROUNDS=5 EVENTS=5000
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from flywheel.kafka import broker as kb
from infra.kafka_admin import ensure_topics
from infra.progress import bar

ROUNDS = int(os.environ.get("ROUNDS", "5"))
EVENTS = int(os.environ.get("EVENTS", "5000"))
LONE = int(os.environ.get("LONE", "200"))
MODES = {"open": {"secure": False}, "scram": {"tls": False}, "tls": {}}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _round(broker: kb.Broker, topic: str) -> dict:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    login = broker.client_config("admin")
    payload = os.urandom(1024).hex().encode()  # 2 KB of random hex: it compresses less than a prompt's text

    t = time.perf_counter()
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **login)
    p.send(topic, b"first").get(timeout=30)
    connect_ms = (time.perf_counter() - t) * 1000
    lone = []
    for i in range(LONE):
        t = time.perf_counter()
        p.send(topic, key=b"k%d" % i, value=payload).get(timeout=30)
        lone.append((time.perf_counter() - t) * 1000)
    p.close()

    p = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
        linger_ms=5,
        **login,
    )
    p.send(topic, b"warm").get(timeout=30)
    cpu, t = _cpu(), time.perf_counter()
    for i in range(EVENTS):
        p.send(topic, key=b"k%d" % i, value=payload)
    p.flush(timeout=120)
    produce_s, produce_cpu = time.perf_counter() - t, _cpu() - cpu
    p.close()

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, **login)
    parts = [TopicPartition(topic, n) for n in sorted(c.partitions_for_topic(topic))]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    want = sum(c.end_offsets(parts).values())
    got, t = 0, time.perf_counter()
    while got < want:
        got += sum(len(rs) for rs in c.poll(timeout_ms=1000).values())
    consume_s = time.perf_counter() - t
    c.close()
    return {
        "produce_events_per_s": EVENTS / produce_s,
        "lone_send_p50_ms": statistics.median(lone),
        "consume_events_per_s": want / consume_s,
        "first_send_ms": connect_ms,
        "client_cpu_ms_per_event": produce_cpu * 1000 / EVENTS,
    }


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-security-"))
    os.environ.pop(kb.SECURITY_DIR_ENV, None)  # each broker its own credentials
    brokers: dict[str, kb.Broker] = {}
    try:
        for mode, kw in MODES.items():
            brokers[mode] = kb.start(kb.BrokerConfig(data_dir=tmp / mode, **kw))
        rounds: dict[str, list[dict]] = {m: [] for m in MODES}
        with bar(total=ROUNDS * len(MODES), desc="kafka security rounds") as progress:
            for r in range(ROUNDS):
                order = list(MODES) if r % 2 == 0 else list(reversed(MODES))  # neither always first
                for mode in order:
                    topic = f"bench-{r}"
                    os.environ.update(brokers[mode].client_env("admin"))
                    ensure_topics(brokers[mode].bootstrap)
                    rounds[mode].append(_round(brokers[mode], topic))
                    progress.update(1)
    finally:
        for b in brokers.values():
            b.stop()
    med = {m: {k: round(statistics.median(x[k] for x in rs), 3) for k in rs[0]} for m, rs in rounds.items()}

    def ratio(mode: str, key: str) -> float:
        return round(statistics.median(s[key] / o[key] for s, o in zip(rounds[mode], rounds["open"])), 3)

    result = {
        "rounds": ROUNDS,
        "events_per_round": EVENTS,
        "event_bytes": 2048,
        **{f"{m}_{k}": v for m, d in med.items() for k, v in d.items()},
        **{
            f"{m}_over_open_{k}": ratio(m, k)
            for m in ("scram", "tls")
            for k in ("produce_events_per_s", "lone_send_p50_ms", "consume_events_per_s", "client_cpu_ms_per_event")
        },
    }
    table = ["| mode | produce ev/s | lone send p50 ms | consume ev/s | first send ms | client CPU ms/ev |"]
    table.append("|---|---|---|---|---|---|")
    for m, d in med.items():
        table.append(
            f"| {m} | {d['produce_events_per_s']:.0f} | {d['lone_send_p50_ms']:.2f} | {d['consume_events_per_s']:.0f} "
            f"| {d['first_send_ms']:.0f} | {d['client_cpu_ms_per_event']:.3f} |"
        )
    print("\n".join(table), flush=True)
    return result


if __name__ == "__main__":
    print(json.dumps(main()))
