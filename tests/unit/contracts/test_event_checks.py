"""Records from the broker are untrusted input: every decoder refuses what its consumers cannot rely on, with the
reason they count it by (the same corpus tests/integration/contracts/test_hostile_records.py writes to a real
broker)."""

from __future__ import annotations

import pytest

from contracts import control, events as ev
from tests import hostile_records
from weight_sync.manifest import generate_key, load_private


def _id(x) -> str | None:
    # The record's bytes hold random ids: their repr (even its quotes) differs between processes, and xdist's
    # workers must collect the same ids. None: pytest's own id (the argument's name and index).
    return None if isinstance(x, bytes) else str(x)[:24]


@pytest.mark.parametrize("topic,key,value,reason", hostile_records.events(), ids=_id)
def test_each_hostile_event_is_refused_with_its_reason(topic, key, value, reason):
    with pytest.raises(ev.BadRecord) as e:
        ev.decode(value, topic)
    assert e.value.reason == reason and e.value.reason in ev.REASONS, str(e.value)
    assert isinstance(e.value, ev.SchemaError)  # the older name still catches it


def test_each_hostile_weights_record_is_refused_with_its_reason(tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    generate_key(tmp_path / "o.pem", tmp_path / "o.pub")
    key = load_private(tmp_path / "k.pem")
    for _, _, value, reason in hostile_records.weights(key, load_private(tmp_path / "o.pem")):
        with pytest.raises(control.ControlError) as e:
            control.decode(value, key.public_key())
        assert e.value.reason == reason, (value[:80], str(e.value))


def test_what_the_gateway_writes_still_decodes():
    c = hostile_records.completion()
    for raw in (c.encode(), ev.withhold(c.encode(), "policy"), ev.withhold(c.encode(), "secret", ["aws"])):
        assert isinstance(ev.decode(raw, ev.TOPIC_COMPLETIONS), ev.CompletionEvent)
    f = ev.FeedbackEvent("c", 0, "t", "persisted", still_present=True, after_s=30, elapsed_ms=12, edit_distance=0)
    assert ev.decode(f.encode(), ev.TOPIC_FEEDBACK) == f
    t = ev.TenantRecord("t", retention_days=30, forgotten_before=1.5)
    assert ev.decode(t.encode(), ev.TOPIC_TENANTS) == t
    assert ev.decode(t.encode()) == t  # no topic named: any kind


def test_a_signed_record_with_a_number_that_is_not_finite_is_invalid():
    with pytest.raises(control.ControlError, match="invalid"):
        control.validate(control.make("canary", 3, seq=1, replicas=["r1"], share=0.5) | {"share": float("nan")})
