"""A session id is the client's free text: one that holds a secret never reaches the broker, as a value or as a
key, yet the session still links its turns and its outcome. The session gateway process (a real SGLang replica
behind it) and the real broker, read back from the topics themselves."""

from __future__ import annotations

import hashlib

import pytest

from contracts import events as ev
from infra.kafka_admin import records_to_end
from tests.helpers import events_until, post

pytestmark = pytest.mark.timeout(300)

AWS_ID = "".join(("AKIA", "Q3EGRDFJ7XM2KZ4P"))  # a fake, in pieces (no scanner takes this file for a leak)
GITHUB = "".join(("ghp_", "x7Kq2mZ9vR4tW8yB3nL6pD1sF5hJ0cA2eG7u"))


def test_a_session_id_holding_a_secret_never_reaches_kafka(gateway, kafka_bootstrap):
    alice = hashlib.sha256(b"key-alice").hexdigest()[:16]
    chat = {"model": "flywheel-coder", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4}
    secret_ids = [f"deploy-{AWS_ID}", f"ci/{GITHUB}"]
    cids = []
    for sid in secret_ids:
        status, body, headers = post(
            f"{gateway.url}/v1/chat/completions", chat, key="key-alice", headers={"X-Session-Id": sid}
        )
        assert status == 200 and body["session_id"] == sid and headers["X-Session-Id"] == sid  # the client's own
        cids.append(body["id"])
        status, body, _ = post(f"{gateway.url}/v1/feedback", {"session_id": sid, "kind": "accept"}, key="key-alice")
        assert status == 200 and body["session_id"] == sid
    clean = "my-ide-session-7"  # a name without a secret goes as it is
    status, body, _ = post(f"{gateway.url}/v1/chat/completions", chat, key="key-alice", headers={"X-Session-Id": clean})
    assert status == 200
    cids.append(body["id"])

    completions = events_until(
        kafka_bootstrap, ev.TOPIC_COMPLETIONS, lambda es: set(cids) <= {e.completion_id for e in es}
    )
    turns = {e.completion_id: e for e in completions if e.completion_id in cids}
    assert turns[cids[2]].session_id == clean
    logged = [turns[c].session_id for c in cids[:2]]
    assert all(s.startswith("withheld-") for s in logged) and logged[0] != logged[1]
    outcomes = events_until(
        kafka_bootstrap,
        ev.TOPIC_FEEDBACK,
        lambda es: set(logged) <= {e.session_id for e in es if e.tenant == alice},
    )
    assert {e.session_id for e in outcomes if e.tenant == alice and e.session_id in logged} == set(logged)
    # Nothing of either secret in any record of either topic, key or value.
    for topic in (ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK):
        for r in records_to_end(kafka_bootstrap, topic):
            for part in (r.key or b"", r.value or b""):
                assert AWS_ID.encode() not in part and GITHUB.encode() not in part, (topic, r.offset)
