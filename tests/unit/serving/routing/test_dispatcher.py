"""The gateway's dispatcher and replica pool in this process, against fake replicas (tests.fake_engine):
a retry before the first byte, a replica that breaks mid-stream, the canary split, borrow and return.
The same paths against real SGLang are in tests/integration (test_gateway, test_offpeak, test_canary)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fake_engine import gateway_over_fakes

pytestmark = pytest.mark.timeout(120)
ADMIN = {"Authorization": "Bearer admin-secret"}


def key(i: int = 0) -> dict:
    return {"Authorization": f"Bearer key-u{i}"}


def run(test_model, tmp_path, versions, scenario, **cfg):
    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", versions, **cfg) as (client, fakes):
            return await scenario(client, fakes)

    return asyncio.run(main())


async def complete(client, i: int = 0, stream: bool = False, **kw):
    body = {"model": "m", "prompt": "def f(x):", "max_tokens": 8, "stream": stream, **kw}
    return await client.post("/v1/completions", json=body, headers=key(i))


async def replicas(client) -> dict[str, dict]:
    r = await client.get("/admin/replicas", headers=ADMIN)
    return {x["id"]: x for x in (await r.json())["replicas"]}


async def metric(client, name: str) -> float:
    text = await (await client.get("/metrics")).text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_replica_failing_before_the_first_byte_is_retried_on_another(test_model, tmp_path):
    async def scenario(client, fakes):
        fakes[0].fail_status = 503  # the first pick of a fresh pool (ties rotate from r0)
        answers = [await complete(client, stream=bool(i % 2)) for i in range(4)]
        retries = await metric(client, "flywheel_gateway_replica_retries_total")
        return [a.status for a in answers], await replicas(client), retries

    statuses, reps, retries = run(test_model, tmp_path, [1, 1], scenario)
    assert statuses == [200] * 4
    assert reps["r0"]["healthy"] is False and "503" in reps["r0"]["last_error"] and reps["r0"]["served"] == 0
    assert reps["r1"]["served"] == 4 and retries == 1  # out of rotation after its one failure


def test_the_failed_attempt_is_aborted_on_its_replica(test_model, tmp_path):
    """A replica that did not answer in time may still be generating: the gateway closes the connection,
    which SGLang takes as an abort (the gateway holds no admin key for /abort_request)."""

    async def scenario(client, fakes):
        fakes[0].delay_s = 5.0
        assert (await complete(client)).status == 200  # r1 answers after r0 timed out
        for _ in range(200):  # r0 notices the closed connection at its next look
            if fakes[0].aborted:
                break
            await asyncio.sleep(0.02)
        return fakes[0].rids, fakes[0].aborted

    rids, aborted = run(test_model, tmp_path, [1, 1], scenario, request_timeout_s=0.5)
    assert aborted == rids and len(rids) == 1


def test_a_replica_breaking_mid_stream_fails_the_request_and_leaves_rotation(test_model, tmp_path):
    async def scenario(client, fakes):
        fakes[0].break_mid_stream = True
        fakes[0].texts = ["def f(x):\n    return x + 1\n"]
        r = await complete(client, stream=True)
        status, lines = r.status, [ln async for ln in r.content if ln.startswith(b"data: ")]
        after = await complete(client)  # the next request goes to the healthy replica
        return status, lines, after.status, fakes[1].rids, await replicas(client)

    status, lines, after, r1_rids, reps = run(test_model, tmp_path, [1, 1], scenario)
    assert status == 200  # the first chunk had gone out: the error comes in the stream
    first, error = json.loads(lines[0][6:]), json.loads(lines[-2][6:])
    assert first["choices"][0]["text"] and lines[-1].strip() == b"data: [DONE]"
    assert error["error"]["code"] == "replica_failed"
    assert reps["r0"]["healthy"] is False and after == 200 and len(r1_rids) == 1  # never retried mid-answer


def test_the_canary_split_keeps_each_user_on_one_arm(test_model, tmp_path):
    async def scenario(client, fakes):
        r = await client.put("/admin/canary", json={"version": 2, "replicas": ["r1"], "share": 0.5}, headers=ADMIN)
        assert r.status == 200, await r.text()
        seen: dict[int, set] = {}
        for rnd in range(3):
            for i in range(20):
                body = await (await complete(client, i, stream=bool(rnd == 1))).read()
                if rnd != 1:
                    seen.setdefault(i, set()).add(json.loads(body)["model_version"])
        arms = (await (await client.get("/admin/canary", headers=ADMIN)).json())["canary"]["arms"]
        bad = [
            await client.put("/admin/canary", json=b, headers=ADMIN)
            for b in (
                {"version": 2, "replicas": ["r0", "r1"], "share": 0.5},  # no stable replica left
                {"version": 2, "replicas": ["r9"], "share": 0.5},
                {"version": 2, "replicas": ["r1"], "share": 1},
                {"version": "two", "replicas": ["r1"], "share": 0.5},
                {"version": 2, "replicas": ["r1"], "share": 0.5, "why": "x"},
            )
        ]
        ended = await (await client.delete("/admin/canary", headers=ADMIN)).json()
        return seen, arms, [(b.status, (await b.json())["error"]["param"]) for b in bad], ended

    seen, arms, bad, ended = run(test_model, tmp_path, [1, 2], scenario)
    assert all(len(v) == 1 for v in seen.values())  # a user stays on its arm
    on_canary = sum(v == {2} for v in seen.values())
    assert 0 < on_canary < 20 and arms["canary"]["requests"] == 3 * on_canary
    assert arms["stable"]["requests"] == 3 * (20 - on_canary)
    assert bad == [(400, "replicas"), (400, "replicas"), (400, "share"), (400, "version"), (400, "why")]
    assert ended["canary"]["version"] == 2


def test_borrow_waits_for_users_then_lends_and_return_aborts_rollouts(test_model, tmp_path):
    async def scenario(client, fakes):
        fakes[0].delay_s = 0.5
        user = asyncio.ensure_future(complete(client))  # lands on r0 (a fresh pool starts there)
        await asyncio.sleep(0.2)
        r = await client.post("/admin/replicas/r0/borrow", headers=ADMIN)
        pending = await r.json()
        during = [(await (await complete(client, 1)).json())["model_version"] for _ in range(3)]
        assert (await user).status == 200  # the user's request in flight finished
        for _ in range(100):
            if (await replicas(client))["r0"]["state"] == "borrowed":
                break
            await asyncio.sleep(0.02)
        borrowed = (await replicas(client))["r0"]
        last = await client.post("/admin/replicas/r1/drain", headers=ADMIN)  # r1 is the last active one
        rollout = asyncio.ensure_future(
            client.post(
                "/admin/rollouts", json={"prompt": "def f(x):", "max_tokens": 4, "replicas": "borrowed"}, headers=ADMIN
            )
        )
        await asyncio.sleep(0.2)
        back = await (await client.post("/admin/replicas/r0/return", headers=ADMIN)).json()
        rolled = await rollout
        answer = (rolled.status, (await rolled.json())["choices"][0]["finish_reason"])
        return pending, during, borrowed, last.status, back, answer, fakes[0]

    pending, during, borrowed, last, back, rolled, r0 = run(test_model, tmp_path, [1, 2], scenario)
    assert pending["state"] == "draining" and pending["borrow_pending"] is True
    assert during == [2, 2, 2]  # users went to r1 while r0 drained
    assert borrowed["state"] == "borrowed" and borrowed["outstanding"] == 0
    assert last == 409  # refused: it would leave no replica for users
    assert back["state"] == "active"
    rollout_rids = [rid for rid in r0.rids if rid.startswith("rollout-")]
    assert len(rollout_rids) == 1 and r0.aborted == rollout_rids  # the rollout in flight was stopped
    assert rolled == (200, "abort")  # the trainer is told, to redo it


def test_bodies_are_checked_by_their_schema(test_model, tmp_path):
    async def scenario(client, fakes):
        cid = (await (await complete(client)).json())["id"]
        cases = [
            ("/v1/feedback", {"completion_id": cid, "kind": "maybe"}, "kind"),
            ("/v1/feedback", {"completion_id": cid, "kind": "accept", "extra": 1}, "extra"),
            ("/v1/feedback", {"completion_id": cid, "kind": "accept", "choice_index": 99}, "choice_index"),
            ("/v1/feedback", {"completion_id": cid, "kind": "accept", "elapsed_ms": -1}, "elapsed_ms"),
            ("/v1/events", {"type": "select"}, "completion_id"),
            ("/v1/events", {"type": "hover", "completion_id": cid}, "type"),
        ]
        out = []
        for path, body, _ in cases:
            r = await client.post(path, json=body, headers=key())
            out.append((r.status, (await r.json())["error"]["param"]))
        tabby = await client.post(
            "/v1/events", json={"type": "view", "completion_id": cid, "view_id": "v"}, headers=key()
        )
        drain = await client.post("/admin/replicas/r0/drain", json={"lease_s": 0}, headers=ADMIN)
        activate = await client.post("/admin/replicas/r0/activate", data=b"{nope", headers=ADMIN)
        unknown = [(await client.get(p)).status for p in ("/admin/nope", "/v1/nope")]  # no token, no key
        return out, [c[2] for c in cases], tabby.status, drain.status, activate.status, unknown

    out, params, tabby, drain, activate, unknown = run(test_model, tmp_path, [1, 1], scenario)
    assert out == [(400, p) for p in params]
    assert tabby == 200  # Tabby's own extra fields are ignored
    assert drain == 400 and activate == 400
    assert unknown == [404, 404]  # an unknown path is a 404, credentials or not


@pytest.mark.parametrize(
    "garbage",
    [b"not json", b"[1, 2]", b'{"text": "x", "output_ids": 5}', b'{"meta_info": {"routed_experts": "AAAAAAA="}}'],
)
def test_a_replica_answering_garbage_is_a_failed_replica_not_a_500(test_model, tmp_path, garbage):
    """Plain: another replica takes the request. Streamed, garbage after the first chunk: the stream ends with
    an error chunk and [DONE], and the replica is told to stop generating (before: a 500 after the headers,
    a cut stream, and the replica left generating)."""

    async def scenario(client, fakes):
        fakes[0].garbage = garbage
        plain = await complete(client)
        plain_body = await plain.json()
        reps_after_plain = await replicas(client)
        fakes[1].garbage, fakes[1].garbage_after, fakes[0].garbage = garbage, 1, None
        r = await client.post("/admin/replicas/r0/drain", json={}, headers=ADMIN)  # the stream goes to r1
        assert r.status == 200
        streamed = await complete(client, stream=True)
        lines = [ln async for ln in streamed.content if ln.startswith(b"data: ")]
        for _ in range(100):  # the abort goes out soon after
            if fakes[1].aborted:
                break
            await asyncio.sleep(0.05)
        return plain.status, plain_body, reps_after_plain, streamed.status, lines, fakes, await replicas(client)

    status, body, reps0, s_status, lines, fakes, reps = run(test_model, tmp_path, [1, 1], scenario)
    assert status == 200 and body["choices"][0]["text"] == "x = 1"  # served by r1
    assert reps0["r0"]["healthy"] is False and "malformed" in reps0["r0"]["last_error"]
    assert s_status == 200 and json.loads(lines[0][6:])["choices"][0]["text"]
    assert json.loads(lines[-2][6:])["error"]["code"] == "replica_failed" and lines[-1].strip() == b"data: [DONE]"
    assert reps["r1"]["healthy"] is False and fakes[1].aborted == fakes[1].rids[-1:]
