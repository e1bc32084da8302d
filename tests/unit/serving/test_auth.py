"""API keys are kept hashed; completion ids prove their tenant and cannot be forged."""

import json
import time

from admin_api.tokens import AdminTokens
from serving import auth


def test_keys_file_holds_only_hashes(tmp_path):
    f = tmp_path / "keys.json"
    k1, k2 = auth.add_key(f, "alice"), auth.add_key(f, "bob")
    text = f.read_text()
    assert k1 not in text and k2 not in text and auth.hash_key(k1) in text
    store = auth.KeyStore.load(f, "carol:plain-key")
    assert store.lookup(k1).name == "alice" and store.lookup(k2).name == "bob"
    assert store.lookup("plain-key").name == "carol"
    assert store.lookup("wrong") is None and store.lookup(None) is None
    assert store.lookup(k1).id != store.lookup(k2).id
    assert (f.stat().st_mode & 0o777) == 0o600
    assert len(json.loads(text)["keys"]) == 2


def test_completion_ids_know_their_owner():
    ids = auth.CompletionIds(b"secret")
    alice, bob = auth.Tenant("a" * 16, "alice"), auth.Tenant("b" * 16, "bob")
    cid = ids.issue(alice)
    assert ids.owner(cid) == alice.id
    assert cid != ids.issue(alice)
    # Swapping in another tenant breaks the signature: unknown, not "bob's".
    forged = cid.replace(alice.id, bob.id)
    assert ids.owner(forged) is None
    assert auth.CompletionIds(b"other-secret").owner(cid) is None
    for junk in ("", "cmpl-", "cmpl-a-b-c", "x" * 500, None, 42, cid + "0"):
        assert ids.owner(junk) is None


def test_completion_ids_expire():
    ids = auth.CompletionIds(b"s", ttl_s=60)
    cid = ids.issue(auth.Tenant("a" * 16, "a"))
    issued, rest = cid[5:].split("-", 1)
    old_body = f"{int(time.time()) - 120:x}-{rest.rsplit('-', 1)[0]}"
    old = f"cmpl-{old_body}-{ids._mac(old_body)}"
    assert ids.owner(cid) and ids.owner(old) is None


def test_admin_token_and_bearer():
    assert auth.bearer("Bearer abc") == "abc" and auth.bearer("bearer  abc ") == "abc"
    assert auth.bearer("Basic abc") is None and auth.bearer(None) is None and auth.bearer("Bearer ") is None
    tokens = AdminTokens(all="t")  # what the admin API compares with (admin_api.tokens)
    assert tokens.grants("t", "weights") and not tokens.grants("u", "weights")
    assert not AdminTokens().grants("t", "status") and not tokens.grants(None, "status")


def test_tenant_policies_live_in_the_keys_file_and_are_read_again_when_it_changes(tmp_path):
    import pytest

    f = tmp_path / "keys.json"
    k1 = auth.add_key(f, "alice")
    auth.add_key(f, "alice")  # a second key: a second id for the same tenant
    auth.add_key(f, "bob")
    store = auth.KeyStore.load(f)
    assert store.lookup(k1).train == "allow" and store.policy("alice") == auth.Policy()
    assert len(store.tenants()["alice"]) == 2 and len(store.tenants()["bob"]) == 1

    assert auth.set_policy(f, "alice", train="deny", retention_days=30).view() == {
        "train": "deny",
        "retention_days": 30,
        "forgotten_before": None,
    }
    changed = store.reload_if_changed(min_interval_s=0)
    assert {n: p.view() for n, p in changed.items()} == {"alice": auth.Policy(train="deny", retention_days=30).view()}
    assert changed["alice"].version > 0  # each change is versioned (a stale copy's older one cannot win)
    assert store.lookup(k1).train == "deny" and store.policy("bob").train == "allow"
    assert store.reload_if_changed(min_interval_s=0) is None  # nothing new

    # forgotten_before only grows: a later forget with an older clock cannot un-forget
    auth.set_policy(f, "alice", forgotten_before=200.0)
    assert auth.set_policy(f, "alice", forgotten_before=100.0).forgotten_before == 200.0
    assert store.reload_if_changed(min_interval_s=0)["alice"].forgotten_before == 200.0
    assert (f.stat().st_mode & 0o777) == 0o600

    for bad in ({"train": "maybe"}, {"retention_days": -1}, {"retention_days": True}, {"retention_days": 1e9}):
        with pytest.raises(ValueError):
            auth.set_policy(f, "bob", **bad)
    assert auth.KeyStore.load(f).policy("bob") == auth.Policy()  # a refused change changes nothing

    f.write_text("{ half written")  # a broken file: the gateway keeps serving on what it had
    assert store.reload_if_changed(min_interval_s=0) is None and store.lookup(k1).name == "alice"


def test_a_hand_edited_policy_is_checked_and_a_new_key_of_a_tenant_with_a_policy_is_announced(tmp_path):
    import pytest

    f = tmp_path / "keys.json"
    auth.add_key(f, "alice")
    set_to = auth.set_policy(f, "alice", retention_days=7)
    store = auth.KeyStore.load(f)
    auth.add_key(f, "alice")  # a second key: its id must get alice's policy record too
    assert store.reload_if_changed(min_interval_s=0) == {"alice": set_to}
    assert len(store.tenants()["alice"]) == 2

    good = json.loads(f.read_text())
    for bad in ({"train": "Deny"}, {"retention_days": -5}, {"forgotten_before": "yesterday"}, {"colour": "red"}, []):
        f.write_text(json.dumps({**good, "tenants": {"alice": bad}}))
        with pytest.raises(ValueError, match="alice"):
            auth.KeyStore.load(f)
        assert store.reload_if_changed(min_interval_s=0) is None  # the running gateway keeps what it had
        assert store.policy("alice").retention_days == 7
