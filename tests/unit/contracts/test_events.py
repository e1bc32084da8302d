"""The event contract: compact binary fields, lossless round trip, clear errors on bad records."""

import msgpack
import numpy as np
import pytest

from contracts import events as ev


def _completion():
    return ev.CompletionEvent(
        completion_id="cmpl-x",
        choice_index=1,
        tenant="t" * 16,
        model_version=3,
        prompt_ids=np.arange(20, dtype=np.int32),
        output_ids=np.array([5, 6, 7], np.int32),
        logprobs=np.array([-0.5, -0.25, -1e-7], np.float32),
        routed_experts=np.random.default_rng(0).integers(0, 8, (22, 4, 2)).astype(np.uint8),
        sampling={"temperature": 0.7},
        finish_reason="stop",
        latency={"e2e_ms": 12.5},
        weight_versions=[{"version": 3, "start": 0, "end": 2}, {"version": 4, "start": 2, "end": 3}],
        switch_index=2,
        cached_tokens=16,
    )


def test_completion_round_trip_is_exact():
    e = _completion()
    back = ev.decode(e.encode())
    assert isinstance(back, ev.CompletionEvent)
    for f in ("prompt_ids", "output_ids", "logprobs", "routed_experts"):
        assert np.array_equal(getattr(back, f), getattr(e, f)) and getattr(back, f).dtype == getattr(e, f).dtype
    assert back.event_id == e.event_id and back.switch_index == 2 and back.weight_versions == e.weight_versions
    assert back.cached_tokens == 16


def test_versions_are_ints_and_old_string_versions_decode_to_them():
    raw = msgpack.unpackb(_completion().encode(), raw=False)
    raw["model_version"], raw["weight_versions"] = "3", [{"version": "3", "start": 0, "end": 2}]
    back = ev.decode(msgpack.packb(raw, use_bin_type=True))
    assert back.model_version == 3 and back.weight_versions == [{"version": 3, "start": 0, "end": 2}]
    assert [ev.parse_version(v) for v in (0, 7, "12", "default", "", None, -1, True, "1e3", "٣", 2.0)] == [
        0,
        7,
        12,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]


def test_fields_from_a_newer_producer_are_dropped_not_refused():
    raw = msgpack.unpackb(_completion().encode(), raw=False)
    raw["a_field_from_the_future"] = 1
    back = ev.decode(msgpack.packb(raw, use_bin_type=True))
    assert back.completion_id == "cmpl-x" and not hasattr(back, "a_field_from_the_future")


def test_routed_experts_travel_as_bytes_not_int_lists():
    raw = msgpack.unpackb(_completion().encode(), raw=False)
    assert isinstance(raw["routed_experts"], bytes) and len(raw["routed_experts"]) == 22 * 4 * 2
    assert isinstance(raw["output_ids"], bytes) and isinstance(raw["logprobs"], bytes)
    assert raw["schema"] == ev.COMPLETION_SCHEMA and raw["event_id"] and raw["ts"] > 0


def test_feedback_round_trip():
    f = ev.FeedbackEvent(completion_id="cmpl-x", choice_index=0, tenant="t", kind="partial", accepted_chars=12)
    assert ev.decode(f.encode()) == f


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"schema": "nope"}),
        msgpack.packb({"schema": ev.COMPLETION_SCHEMA, "completion_id": "x"}),
    ],
)
def test_bad_records_raise_schema_error(raw):
    with pytest.raises(ev.SchemaError):
        ev.decode(raw)


def test_events_from_before_cached_tokens_decode_with_none():
    d = msgpack.unpackb(_completion().encode(), raw=False)
    del d["cached_tokens"]
    assert ev.decode(msgpack.packb(d, use_bin_type=True)).cached_tokens is None
