"""Tenants' policies through the gateway (in this process, over fake replicas, events to its spool): the admin API's
answers and refusals, `train: deny` logging content-free events, a forget redacting the spool and announcing the
tenant's record, and a policy written to the keys file by `flywheel keys policy` taking effect in the running
gateway. The same against Kafka and the trainer: tests/integration/serving/tenants/test_tenant_privacy_live.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from contracts import events as ev
from serving import auth
from serving.event_log.spool import Spool
from tests.fake_engine import gateway_over_fakes

pytestmark = pytest.mark.timeout(120)
ADMIN = {"Authorization": "Bearer admin-secret"}
SECRET_PROMPT = "def checksum_alice_zebra(x):"  # a string that is alice's code and nobody else's


def spooled(state_dir) -> list[tuple]:
    """(topic, key, decoded event or None for a redacted record, raw value) of every record in the spool."""
    spool = Spool(state_dir / "spool")
    segs = spool.segments()
    if not segs:
        return []
    records, _, _ = spool.read((segs[0], 0), (segs[-1] + 1, 0), 1_000_000)
    return [(t, k, None if v is None else ev.decode(v), v) for t, k, v, _meta in records]


def run(test_model, tmp_path, scenario, **cfg):
    keys = tmp_path / "keys.json"
    key_a, key_b = auth.add_key(keys, "alice"), auth.add_key(keys, "bob")

    async def main():
        async with gateway_over_fakes(
            test_model, tmp_path / "gw", [1], tenants=0, keys_file=keys, log_events=True, **cfg
        ) as (
            client,
            fakes,
        ):
            return await scenario(client, fakes, {"alice": key_a, "bob": key_b}, keys)

    return asyncio.run(main())


async def complete(client, key: str, prompt: str = "def f(x):"):
    r = await client.post(
        "/v1/completions",
        json={"model": "m", "prompt": prompt, "max_tokens": 8},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status == 200, await r.text()
    return (await r.json())["id"]


async def comment(client, key: str, cid: str, text: str) -> None:
    r = await client.post(
        "/v1/feedback",
        json={"completion_id": cid, "kind": "comment", "text": text},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status == 200, await r.text()


def test_admin_api_sets_policies_and_refuses_what_nobody_can_mean(test_model, tmp_path):
    async def scenario(client, fakes, keys, keys_file):
        answers = {}
        r = await client.get("/admin/tenants", headers=ADMIN)
        answers["list"] = await r.json()
        r = await client.put("/admin/tenants/bob", json={"train": "deny", "retention_days": 30}, headers=ADMIN)
        answers["put"] = (r.status, await r.json())
        for name, body in (
            ("bob", {"train": "maybe"}),
            ("bob", {"retention_days": -1}),
            ("bob", {"retention_days": "30"}),
            ("bob", {"color": "red"}),
            ("bob", {}),
        ):
            r = await client.put(f"/admin/tenants/{name}", json=body, headers=ADMIN)
            answers.setdefault("bad", []).append((r.status, (await r.json())["error"]["message"]))
        r = await client.put("/admin/tenants/bob", data=b"{not json", headers=ADMIN)
        answers["bad"].append((r.status, (await r.json())["error"]["message"]))
        r = await client.put("/admin/tenants/nobody", json={"train": "deny"}, headers=ADMIN)
        answers["unknown"] = r.status
        r = await client.post("/admin/tenants/nobody/forget", headers=ADMIN)
        answers["unknown_forget"] = r.status
        r = await client.put("/admin/tenants/bob", json={"train": "allow"})
        answers["no_token"] = r.status
        r = await client.put("/admin/tenants/bob", json={"retention_days": 0}, headers=ADMIN)
        answers["cleared"] = (await r.json())["policy"]
        return answers

    a = run(test_model, tmp_path, scenario)
    assert {t["name"] for t in a["list"]["tenants"]} == {"alice", "bob"}
    assert all(
        t["policy"] == {"train": "allow", "retention_days": None, "forgotten_before": None}
        for t in a["list"]["tenants"]
    )
    status, bob = a["put"]
    assert status == 200 and bob["policy"]["train"] == "deny" and bob["policy"]["retention_days"] == 30
    assert all(s == 400 for s, _ in a["bad"]), a["bad"]
    assert a["unknown"] == 404 and a["unknown_forget"] == 404 and a["no_token"] == 401
    assert a["cleared"] == {"train": "deny", "retention_days": None, "forgotten_before": None}
    assert auth.KeyStore.load(tmp_path / "keys.json").policy("bob").train == "deny"  # persisted


def test_deny_logs_no_content_and_forget_redacts_the_spool(test_model, tmp_path):
    async def scenario(client, fakes, keys, keys_file):
        fakes[0].texts = ["return x + 1"]
        kept = await complete(client, keys["alice"], SECRET_PROMPT)
        await comment(client, keys["alice"], kept, "use a zebra loop")
        r = await client.put("/admin/tenants/bob", json={"train": "deny"}, headers=ADMIN)
        assert r.status == 200
        denied = await complete(client, keys["bob"], "def bob_private_thing(y):")
        await comment(client, keys["bob"], denied, "bob says use recursion")
        before = spooled(tmp_path / "gw")
        r = await client.post("/admin/tenants/alice/forget", headers=ADMIN)
        forgotten = await r.json()
        after_forget = await complete(client, keys["alice"], "def after_the_forget(z):")
        await asyncio.sleep(0.3)
        return kept, denied, before, forgotten, after_forget

    kept, denied, before, forgotten, after_forget = run(test_model, tmp_path, scenario)
    by_key = {(t, k): e for t, k, e, _ in before if e is not None and t != ev.TOPIC_TENANTS}
    alice = by_key[(ev.TOPIC_COMPLETIONS, kept)]
    assert alice.withheld == "" and alice.prompt_ids.size > 0  # allowed: logged whole (before the forget)
    bob = by_key[(ev.TOPIC_COMPLETIONS, denied)]
    assert bob.withheld == "policy" and bob.prompt_ids.size == bob.output_ids.size == bob.logprobs.size == 0
    assert bob.routed_experts.size == 0 and "stop" not in bob.sampling
    bob_comment = by_key[(ev.TOPIC_FEEDBACK, denied)]
    assert bob_comment.kind == "comment" and bob_comment.text is None and bob_comment.withheld == "policy"
    tenant_records = [e for t, _, e, _ in before if t == ev.TOPIC_TENANTS]
    assert [(r.name, r.train) for r in tenant_records] == [("bob", "deny")]

    assert forgotten["policy"]["forgotten_before"] == forgotten["forgotten_before"] <= time.time()
    records = spooled(tmp_path / "gw")
    raw = b"".join(p.read_bytes() for p in (tmp_path / "gw" / "spool").glob("*.log"))
    assert b"zebra" not in raw  # alice's comment and code are gone from the disk, not merely skipped
    alice_id = forgotten["ids"][0]
    live = [e for t, _, e, _ in records if e is not None]
    assert not [
        e
        for e in live
        if isinstance(e, ev.CompletionEvent) and e.tenant == alice_id and e.ts <= forgotten["forgotten_before"]
    ]
    assert any(isinstance(e, ev.CompletionEvent) and e.completion_id == after_forget for e in live)  # later: kept
    forget_record = [e for e in live if isinstance(e, ev.TenantRecord) and e.name == "alice"]
    assert len(forget_record) == 1 and forget_record[0].forgotten_before == forgotten["forgotten_before"]
    assert forget_record[0].tenant == alice_id
    assert any(isinstance(e, ev.CompletionEvent) and e.completion_id == denied for e in live)  # bob's, untouched


def test_a_policy_written_to_the_keys_file_reaches_the_running_gateway(test_model, tmp_path):
    async def scenario(client, fakes, keys, keys_file):
        await complete(client, keys["alice"])
        auth.set_policy(keys_file, "alice", train="deny", retention_days=7)  # `flywheel keys policy`
        await asyncio.sleep(2.5)  # the gateway's own poll (every second), no admin call to prompt it
        cid = await complete(client, keys["alice"])
        await asyncio.sleep(0.3)
        return cid

    cid = run(test_model, tmp_path, scenario)
    records = spooled(tmp_path / "gw")
    event = next(e for t, k, e, _ in records if t == ev.TOPIC_COMPLETIONS and k == cid)
    assert event.withheld == "policy"
    policy = [e for t, _, e, _ in records if t == ev.TOPIC_TENANTS]
    assert [(r.name, r.train, r.retention_days) for r in policy] == [("alice", "deny", 7)]


def test_a_keys_file_no_gateway_can_load_refuses_a_change(test_model, tmp_path):
    async def scenario(client, fakes, keys, keys_file):
        data = json.loads(keys_file.read_text())
        keys_file.write_text(json.dumps({**data, "tenants": {"bob": {"train": "Deny"}}}))
        r = await client.post("/admin/tenants/alice/forget", headers=ADMIN)
        return r.status, (await r.json())["error"]

    status, error = run(test_model, tmp_path, scenario)
    assert status == 409 and error["code"] == "keys_file_invalid" and "bob" in error["message"]
    assert "alice" not in json.loads((tmp_path / "keys.json").read_text())["tenants"]  # nothing was written


def test_a_secret_the_model_finishes_is_scanned_whole(test_model, tmp_path):
    """The user types the start of a key, the model completes it: neither text holds it alone, and the
    shipper is given prompt + output + suffix as one text (and the stop strings)."""
    from serving.event_log.secret_scrub import Scrubber

    head, tail = 'aws_access_key_id = "AKIAQ3EG', 'RDFJ7XM2KZ4P"\n'

    async def scenario(client, fakes, keys, keys_file):
        fakes[0].texts = [tail]
        cid = await complete(client, keys["alice"], head)
        await asyncio.sleep(0.3)
        return cid

    cid = run(test_model, tmp_path, scenario)
    spool = Spool(tmp_path / "gw" / "spool")
    segs = spool.segments()
    records, _, _ = spool.read((segs[0], 0), (segs[-1] + 1, 0), 1000)
    meta = next(m for t, k, _, m in records if t == ev.TOPIC_COMPLETIONS and k == cid)
    scrubber = Scrubber()
    assert scrubber.find([head]) == [] and scrubber.find([tail]) == []  # each half alone is clean
    assert "AWS Access Key" in scrubber.find(meta["scan"])
