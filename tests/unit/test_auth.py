"""API keys are kept hashed; completion ids prove their tenant and cannot be forged."""

import json
import time

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
    assert auth.admin_ok("t", "t") and not auth.admin_ok("t", "u") and not auth.admin_ok("t", None)
    assert not auth.admin_ok(None, "t")
