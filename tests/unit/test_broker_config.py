"""The broker's formatting arguments."""

from flywheel.kafka_broker import new_cluster_id


def test_cluster_ids_never_read_as_options():
    ids = [new_cluster_id() for _ in range(3000)]  # one in 64 raw ids starts with "-"
    assert all(len(c) == 22 and not c.startswith("-") for c in ids) and len(set(ids)) == len(ids)
