"""Routing policies (serving.routing) on the pool's candidates: no servers, the choice alone."""

import random

import pytest

from serving.config import RoutingConfig
from serving.routing.policy import RouteRequest
from serving.routing.pool import Lease, ReplicaPool, make_policy
from serving.routing.prefix_index import PrefixIndex, block_names

B = 16


def _pool(n=2, **routing):
    p = ReplicaPool([f"http://r{i}" for i in range(n)], routing=RoutingConfig(**routing))
    for r in p.replicas.values():
        r.healthy = True
    return p


def _file(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def test_block_names_name_whole_prefixes():
    a = _file(0, 100)
    b = a[:50] + [7] + a[51:]  # differs in block 3 (tokens 48..63)
    na, nb = block_names(a, B), block_names(b, B)
    assert len(na) == 6  # full blocks only: 96 of 100 tokens
    assert na[:3] == nb[:3] and all(x != y for x, y in zip(na[3:], nb[3:]))  # a change ends every later match
    assert block_names(a[:64], B) == na[:4]


def test_the_index_matches_leading_blocks_and_evicts_leaves_first():
    idx = PrefixIndex(capacity_blocks=8)
    a = block_names(_file(0, 96), B)  # 6 blocks
    idx.insert(a)
    assert idx.match(a) == 6 and idx.match(block_names(_file(1, 96), B)) == 0
    b = a[:2] + block_names(_file(0, 32) + _file(2, 64), B)[2:]  # shares the first two blocks with a
    idx.insert(b)  # 4 new blocks: 10 > 8, the two oldest leaves of a go
    assert len(idx) == 8
    assert idx.match(b) == 6 and idx.match(a) == 4  # a's prefix is kept, its deepest blocks went
    idx.resize(3)
    assert idx.match(b) == 3 and len(idx) == 3  # the shortest prefixes are the most recent: they stay


def test_cache_aware_keeps_a_user_on_the_replica_that_holds_its_file():
    p = _pool()
    f = _file(0, 2000)
    first = p.pick(req=RouteRequest(f[:1000], "alice"))
    for cursor in range(1010, 2000, 90):  # the user types on: each prompt extends the last
        assert p.pick(req=RouteRequest(f[:cursor], "alice")).id == first.id
    p.pick(req=RouteRequest(_file(1, 1500), "bob"))  # nothing cached anywhere: least loaded, rotating
    assert p.policy.view()["decisions"] == {"no_match": 2, "match": 11}


def test_least_outstanding_scatters_the_same_user():
    p = _pool(policy="least_outstanding")
    f = _file(0, 2000)
    assert {p.pick(req=RouteRequest(f[:c], "alice")).id for c in range(1000, 2000, 100)} == {"r0", "r1"}


def test_a_busy_replica_loses_its_cache_advantage_past_the_threshold():
    p = _pool(balance_threshold=2)
    f = _file(0, 1000)
    home = p.pick(req=RouteRequest(f, "a"))
    other = next(r for r in p.replicas.values() if r is not home)
    with Lease(home), Lease(home):
        assert p.pick(req=RouteRequest(f, "a")).id == home.id  # 2 over: within the threshold
        with Lease(home):
            assert p.pick(req=RouteRequest(f, "a")).id == other.id  # 3 over: least outstanding
    assert p.policy.view()["decisions"]["balance"] == 1


def test_short_matches_do_not_pin_requests():
    p = _pool(min_match_tokens=64)
    f = _file(0, 48)  # three blocks: under the threshold
    assert {p.pick(req=RouteRequest(f, "a")).id for _ in range(4)} == {"r0", "r1"}


def test_tenant_affinity_breaks_a_tie_between_equal_matches():
    p = _pool()
    shared = _file(0, 256)  # a prefix both replicas hold (a common header)
    r0, r1 = p.get("r0"), p.get("r1")
    for r in (r0, r1):
        p.policy._index(r).insert(block_names(shared, B))
    p.policy._affinity["carol"] = "r1"
    assert all(p.pick(req=RouteRequest(shared + _file(k, 5), "carol")).id == "r1" for k in range(3))
    p.policy._affinity["dave"] = "r0"
    assert p.pick(req=RouteRequest(shared + _file(9, 5), "dave")).id == "r0"


def test_equal_matches_without_affinity_rotate():
    p = _pool()
    shared = _file(0, 256)  # a header every replica holds
    for r in p.replicas.values():
        p.policy._index(r).insert(block_names(shared, B))
    picked = {p.pick(req=RouteRequest(shared + _file(k, 40), f"t{k}")).id for k in range(4)}
    assert picked == {"r0", "r1"}


def test_a_canary_arm_narrows_the_choice_before_the_cache_does():
    p = _pool(n=4)
    f = _file(0, 2000)
    p.policy._index(p.get("r0")).insert(block_names(f, B))  # the user's file is cached off the arm
    arm = frozenset({"r1", "r2"})
    home = p.pick(prefer=arm, req=RouteRequest(f[:1500], "alice"))
    assert home.id in arm
    for cursor in range(1510, 2000, 70):  # within the arm the user stays where the file now is
        assert p.pick(prefer=arm, req=RouteRequest(f[:cursor], "alice")).id == home.id
    retry = p.pick(exclude={home.id}, prefer=arm, req=RouteRequest(f, "alice"))
    assert retry.id == ({"r1", "r2"} - {home.id}).pop()  # a retry stays in the arm while it can
    p.get("r1").healthy = p.get("r2").healthy = False
    # The arm down: r0 or r3 serves, and the cache decides (r0 holds the file), every time.
    assert {p.pick(prefer=arm, req=RouteRequest(f, "alice")).id for _ in range(4)} == {"r0"}


def test_requests_without_a_prompt_spread_by_load_and_are_not_counted():
    p = _pool()
    assert {p.pick(req=RouteRequest()).id for _ in range(4)} == {"r0", "r1"}
    assert p.policy.view()["decisions"] == {}


def test_an_index_is_dropped_when_its_replica_fails_or_switches_weights():
    p = _pool()
    f = _file(0, 512)
    home = p.pick(req=RouteRequest(f, "a"))
    idx = p.policy.indexes[home.id]
    assert idx.match(block_names(f, B)) == 32
    home.weight_version = 1  # a switch flushes SGLang's cache
    p.policy.on_load_update(home)
    assert len(idx) == 0
    p.pick(req=RouteRequest(f, "a"))
    home2 = next(r for r in p.replicas.values() if len(p.policy.indexes.get(r.id, ())) > 0)
    p.mark_failed(home2, "connection refused")  # a restarted replica starts empty
    assert len(p.policy.indexes[home2.id]) == 0


def test_the_index_follows_the_replica_kv_capacity():
    p = _pool()
    f = _file(0, 4000)
    home = p.pick(req=RouteRequest(f, "a"))
    home.kv_capacity_tokens = 1024  # read from sglang:max_total_num_tokens by the health check
    p.policy.on_load_update(home)
    assert len(p.policy.indexes[home.id]) == 1024 // B


def test_a_replica_that_held_less_than_predicted_is_counted():
    p = _pool()
    f = _file(0, 640)
    p.pick(req=RouteRequest(f, "a"))
    req = RouteRequest(f, "a")
    home = p.pick(req=req)
    p.policy.on_complete(home, req, cached_tokens=639)  # all but the last token: as SGLang reports a full hit
    assert p.policy.view()["mispredicted"] == 0
    p.policy.on_complete(home, req, cached_tokens=128)  # it evicted most of it meanwhile
    assert p.policy.view()["mispredicted"] == 1


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy(RoutingConfig(policy="random"))
