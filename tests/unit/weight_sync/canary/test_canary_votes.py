"""No tenant decides a canary trial alone: a tenant that votes on its own completions as often as it likes (one
vote per completion, but completions cost it nothing) counts for at most a share of its arm's votes. Attacked
through a gateway in this process (stand-in replicas: the votes are the gateway's and the controller's logic),
and the counting itself on its own."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from tests.fake_engine import gateway_over_fakes
from weight_sync.canary.controller import CanaryConfig
from weight_sync.canary.judge import judge

pytestmark = pytest.mark.timeout(180)

ADMIN = {"Authorization": "Bearer admin-secret"}
CHAT = {"model": "flywheel-coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CFG = CanaryConfig(gateway_url="", admin_token="", publish=None, min_feedback=50, min_requests=10**9)


def tenant_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


async def vote(client, key: str, kind: str) -> None:
    h = {"Authorization": f"Bearer {key}"}
    r = await client.post("/v1/chat/completions", json=CHAT, headers=h)
    assert r.status == 200, await r.text()
    cid = (await r.json())["id"]
    assert (await client.post("/v1/feedback", json={"completion_id": cid, "kind": kind}, headers=h)).status == 200


def test_a_tenant_voting_many_times_cannot_decide_a_trial_alone(test_model, tmp_path):
    async def scenario(client, fakes):
        split = {"version": 2, "replicas": ["r1"], "share": 0.5}
        r = await client.put("/admin/canary", json=split, headers=ADMIN)
        assert r.status == 200, await r.text()
        trial = client.gateway.dispatcher.canary
        keys = [f"key-u{i}" for i in range(40)]
        on_canary = [k for k in keys if trial.arm_of(tenant_id(k)) == "canary"]
        on_stable = [k for k in keys if trial.arm_of(tenant_id(k)) == "stable"]
        attacker, honest = on_canary[0], on_canary[1]
        for i in range(60):  # the stable arm: three users, half accepted
            await vote(client, on_stable[i % 3], "accept" if i % 2 else "reject")
        for _ in range(120):  # the attacker accepts every canary answer it asks for
            await vote(client, attacker, "accept")
        alone = (await (await client.get("/admin/canary", headers=ADMIN)).json())["canary"]["arms"]
        for _ in range(10):  # one more canary user, who dislikes the candidate
            await vote(client, honest, "reject")
        both = (await (await client.get("/admin/canary", headers=ADMIN)).json())["canary"]["arms"]
        return alone, both

    alone, both = asyncio.run(_run(test_model, tmp_path, scenario))
    assert alone["canary"]["accepts"] == 120  # every vote was taken and is reported ...
    verdict = judge(alone["canary"], alone["stable"], CFG)
    assert verdict.decision == "extend", verdict  # ... and counts for nothing alone
    assert verdict.figures["canary"]["tenants_voting"] == 1 and verdict.figures["canary"]["feedback"] == 0
    verdict = judge(both["canary"], both["stable"], CFG)
    # Beside a user who voted 10 times, the attacker counts as 10: 20 votes, short of min_feedback.
    assert verdict.decision == "extend" and verdict.figures["canary"]["feedback"] == 20, verdict
    small = judge(both["canary"], both["stable"], CanaryConfig(**{**vars(CFG), "min_feedback": 20}))
    assert small.decision != "promote", small  # half its counted votes reject: no promotion the attacker decides


async def _run(test_model, tmp_path, scenario):
    async with gateway_over_fakes(test_model, tmp_path / "gw", [1, 2]) as (client, fakes):
        return await scenario(client, fakes)


def test_capped_votes():
    from weight_sync.canary.votes import capped_votes

    assert capped_votes([[100, 0]], 0.5) == (0.0, 0.0)  # alone: nothing
    assert capped_votes([[100, 0], [0, 10]], 0.5) == pytest.approx((10.0, 10.0))
    assert capped_votes([[5, 5], [6, 4], [3, 7]], 0.5) == pytest.approx((14.0, 16.0))  # nobody over: as cast
    # four voters at a quarter each: the one who voted 1000 times counts as 10, a quarter of the 40 counted
    assert capped_votes([[1000, 0], [10, 0], [0, 10], [5, 5]], 0.25) == pytest.approx((25.0, 15.0))
    assert capped_votes([[1000, 0], [10, 0], [0, 10]], 0.25) == (0.0, 0.0)  # fewer than 1 / share voters
    assert capped_votes([[100, 0]], 1.0) == (100.0, 0.0)  # no cap
    assert capped_votes([], 0.5) == (0.0, 0.0)


def test_an_older_gateway_without_tenant_votes_is_judged_as_before():
    arm = {"requests": 0, "errors": 0, "accepts": 60, "rejects": 0, "feedback": 60, "p99_ms": None}
    stable = {**arm, "accepts": 30, "rejects": 30}
    assert judge(arm, stable, CFG).decision == "promote"
