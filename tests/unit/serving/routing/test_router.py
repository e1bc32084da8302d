"""Least-outstanding routing over replica states (no servers: the pool's choice alone)."""

import pytest

from serving.routing.pool import Lease, NoReplica, ReplicaPool, ReplicaState


def _pool(n=3):
    p = ReplicaPool([f"http://r{i}" for i in range(n)])
    for r in p.replicas.values():
        r.healthy = True
    return p


def test_least_outstanding_wins_and_ties_rotate():
    p = _pool()
    with Lease(p.get("r0")), Lease(p.get("r0")), Lease(p.get("r1")):
        assert p.pick().id == "r2"
        with Lease(p.get("r2")):
            assert p.pick().id in ("r1", "r2")
    assert p.get("r0").outstanding == 0
    assert {p.pick().id for _ in range(6)} == {"r0", "r1", "r2"}


def test_states_and_health_filter_candidates():
    p = _pool()
    p.get("r0").state = ReplicaState.DRAINING
    p.get("r1").state = ReplicaState.BORROWED
    assert {p.pick().id for _ in range(5)} == {"r2"}
    assert p.pick(rollout=True).id == "r1"
    p.mark_failed(p.get("r2"), "connection refused")
    with pytest.raises(NoReplica):
        p.pick()
    assert p.pick(exclude=set(), rollout=True).id == "r1"
    with pytest.raises(NoReplica):
        p.pick(exclude={"r1"}, rollout=True)


def test_rollout_load_is_counted_apart_from_user_load():
    p = _pool(2)
    p.get("r1").state = ReplicaState.BORROWED
    with Lease(p.get("r1"), rollout=True):
        assert p.get("r1").rollout_outstanding == 1 and p.get("r1").outstanding == 0


def test_a_drain_whose_lease_lapses_takes_users_again():
    from serving.routing.pool import ReplicaPool, ReplicaState

    pool = ReplicaPool(["http://a", "http://b"])
    a, b = pool.replicas["r0"], pool.replicas["r1"]
    a.state, a.drain_lease_until = ReplicaState.DRAINING, 100.0  # an agent's drain
    b.state, b.drain_lease_until = ReplicaState.DRAINING, None  # an SRE's drain: held
    assert pool.expire_drain_leases(now=99.0) == [] and a.state == ReplicaState.DRAINING
    assert pool.expire_drain_leases(now=101.0) == ["r0"]
    assert a.state == ReplicaState.ACTIVE and b.state == ReplicaState.DRAINING and pool.lapsed_drains == 1
