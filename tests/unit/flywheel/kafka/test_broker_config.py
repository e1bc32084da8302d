"""The broker's formatting arguments."""

from flywheel.kafka.broker import new_cluster_id


def test_cluster_ids_never_read_as_options():
    ids = [new_cluster_id() for _ in range(3000)]  # one in 64 raw ids starts with "-"
    assert all(len(c) == 22 and not c.startswith("-") for c in ids) and len(set(ids)) == len(ids)


def test_a_probe_of_a_broker_not_listening_yet_answers_within_its_timeout():
    """kafka-python alone would go on bootstrapping for 30 s, its reconnect backoff doubling, so a probe begun
    just before a broker opened its port answered half a minute later; now a closed port is a quick False, and
    the next probe, half a second later, sees the broker."""
    import time

    from flywheel.kafka.broker import metadata_ok
    from infra.procs import free_port

    t0 = time.monotonic()
    assert metadata_ok(f"127.0.0.1:{free_port()}", 1.0) is False
    assert time.monotonic() - t0 < 1.5
