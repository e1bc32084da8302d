"""What anyone who can write to the broker can put on each topic: garbage, tombstones, events whose fields have the
wrong types or are out of range (`ts: "x"`, NaN rewards, negative ids, lists where packed bytes go, a list of
thousands of spans), an event of one kind on another kind's topic, and weights records unsigned, forged,
oversized or signed by the real key but malformed. Each with the reason its reader must refuse it for."""

from __future__ import annotations

import base64
import json

import msgpack
import numpy as np

from contracts import control, events as ev


def completion(cid: str = "hostile", tenant: str = "t") -> ev.CompletionEvent:
    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=0,
        tenant=tenant,
        model_version=0,
        prompt_ids=np.array([1, 2, 3], np.int32),
        output_ids=np.array([4, 5], np.int32),
        logprobs=np.array([-0.5, -1.0], np.float32),
        routed_experts=np.zeros((4, 2, 2), np.uint8),
        sampling={"temperature": 1.0},
        finish_reason="stop",
        latency={},
    )


def _edit(event, **changes) -> bytes:
    """`event` as its writer encodes it, with fields replaced (or removed: None given as ...)."""
    d = msgpack.unpackb(event.encode(), raw=False)
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return msgpack.packb(d, use_bin_type=True)


def events() -> list[tuple[str, str, bytes | None, str]]:
    """(topic, key, value, reason) for completions, feedback and tenants."""
    c = completion()
    f = ev.FeedbackEvent(completion_id="hostile", choice_index=0, tenant="t", kind="accept")
    t = ev.TenantRecord("victim", train="deny")
    nan32 = np.array([np.nan, -1.0], np.float32).tobytes()
    C, F, T = ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_TENANTS
    return [
        (C, "c1", b"\x00\xffnot msgpack at all", "not_msgpack"),
        (C, "c2", None, "tombstone"),
        (C, "c3", msgpack.packb([1, 2, 3]), "not_a_map"),
        (C, "c4", _edit(c, ts="x"), "wrong_type"),
        (C, "c5", _edit(c, logprobs=nan32), "out_of_range"),
        (C, "c6", _edit(c, prompt_ids=[1, 2, 3]), "wrong_type"),  # ints as a list, not packed
        (C, "c6b", _edit(c, output_ids=list(range(20000))), "out_of_range"),  # and a huge one
        (C, "c7", _edit(c, prompt_ids=np.array([-7, 1], np.int32).tobytes()), "out_of_range"),
        (C, "c8", _edit(c, routed_experts_shape=[10**6, 10**6, 8]), "invalid"),
        (C, "c9", _edit(c, weight_versions=[{"version": 1, "start": 0, "end": 1}] * 5000), "out_of_range"),
        (C, "c10", _edit(c, event_id={"not": "an id"}), "wrong_type"),
        (C, "c11", _edit(c, ts=1e300), "out_of_range"),
        (C, "c12", f.encode(), "wrong_topic"),
        (F, "f1", _edit(f, kind="partial", score=float("nan")), "out_of_range"),
        (F, "f2", _edit(f, ts="x"), "wrong_type"),
        (F, "f3", _edit(f, accepted_chars=-5, kind="partial"), "out_of_range"),
        (F, "f4", _edit(f, kind="love"), "invalid"),
        (F, "f5", _edit(f, choice_index=True), "wrong_type"),
        (F, "f6", _edit(f, completion_id=...), "missing_field"),
        (F, "f7", msgpack.packb({"schema": "flywheel.reward.v9", "reward": 1e9}), "unknown_schema"),
        (F, "f8", json.dumps({"schema": ev.FEEDBACK_SCHEMA, "kind": "accept"}).encode(), "not_msgpack"),
        (T, "victim", _edit(t, ts="x"), "wrong_type"),  # issue #48: it stays in the compacted topic forever
        (T, "victim2", _edit(t, train=5), "wrong_type"),
        (T, "victim3", _edit(t, forgotten_before=float("nan")), "out_of_range"),
        (T, "victim4", b"\xde\xad\xbe\xef", "not_msgpack"),
    ]


def weights(key, other_key) -> list[tuple[str, str, bytes, str]]:
    """(topic, key, value, reason) for the weights topic. `key`: the real signing key (private), `other_key`: any
    other; a record signed by the real key but malformed is what a compromised or buggy signer could send."""
    forged = control.make("pin", 0, seq=10**6, reason="forged")
    bad_fields = {"schema": control.SCHEMA, "type": "pin", "version": "0", "seq": 10**6}
    sig = base64.b64encode(key.sign(json.dumps(bad_fields, sort_keys=True, separators=(",", ":")).encode())).decode()
    W = ev.TOPIC_WEIGHTS
    return [
        (W, "weights", b"not json", "malformed"),
        (W, "weights", b"null", "malformed"),
        (W, "weights", b'{"record": {"type": "pin", "version": NaN, "seq": 1}, "sig": "AAAA"}', "bad_signature"),
        (W, "weights", json.dumps(forged).encode(), "unsigned"),
        (W, "weights", control.encode(forged, other_key), "bad_signature"),
        (W, "weights", json.dumps({"record": {}, "sig": "x" * (100 << 10)}).encode(), "malformed"),  # oversize
        (W, "weights", json.dumps({"record": bad_fields, "sig": sig}).encode(), "invalid"),  # signed, malformed
    ]
