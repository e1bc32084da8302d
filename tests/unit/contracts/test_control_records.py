"""Control records on the weights topic: typed, signed, sequenced; anything else is refused with a reason."""

import json

import pytest

from contracts import control
from weight_sync.manifest import generate_key, load_private


@pytest.fixture
def keys(tmp_path):
    generate_key(tmp_path / "a.pem", tmp_path / "a.pub")
    generate_key(tmp_path / "b.pem", tmp_path / "b.pub")
    return load_private(tmp_path / "a.pem"), load_private(tmp_path / "b.pem")


def test_round_trip_and_tampering(keys):
    key, other = keys
    rec = control.make("pin", 4, seq=12, reason="SRE: hold v4")
    raw = control.encode(rec, key)
    assert control.decode(raw, key.public_key()) == rec
    wire = json.loads(raw)
    wire["record"]["version"] = 2  # an old version slipped into a signed pin
    with pytest.raises(control.ControlError) as e:
        control.decode(json.dumps(wire).encode(), key.public_key())
    assert e.value.reason == "bad_signature"
    with pytest.raises(control.ControlError) as e:
        control.decode(control.encode(rec, other), key.public_key())
    assert e.value.reason == "bad_signature"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"null", "malformed"),
        (b"[1, 2]", "malformed"),
        (b"\xff\xfe", "malformed"),
        (b"42", "malformed"),
        (b'{"type": "pin", "version": 1, "seq": 3}', "unsigned"),
        (b'{"record": [], "sig": "AA=="}', "malformed"),
        (b'{"record": {"type": "pin"}, "sig": "not base64!"}', "bad_signature"),
    ],
)
def test_what_is_not_a_signed_record_is_refused(keys, raw, reason):
    with pytest.raises(control.ControlError) as e:
        control.decode(raw, keys[0].public_key())
    assert e.value.reason == reason


@pytest.mark.parametrize(
    "record",
    [
        {"type": "bogus", "version": 1, "seq": 1},
        {"type": "pin", "seq": 1},
        {"type": "pin", "version": "3", "seq": 1},
        {"type": "pin", "version": True, "seq": 1},
        {"type": "activate", "version": 1},
        {"type": "activate", "version": 1, "seq": 0},
        {"type": "rollback", "version": 2, "seq": 1, "stable": "1"},
        {"type": "canary", "version": 2, "seq": 1, "replicas": [1]},
        {"type": "version", "version": -1, "seq": 1},
    ],
)
def test_records_of_the_wrong_shape_are_invalid_even_when_signed(keys, record):
    key = keys[0]
    import base64

    raw = json.dumps({"record": record, "sig": base64.b64encode(key.sign(control._canonical(record))).decode()})
    with pytest.raises(control.ControlError) as e:
        control.decode(raw.encode(), key.public_key())
    assert e.value.reason == "invalid"
    with pytest.raises(control.ControlError):
        control.encode(record, key)  # and nobody can sign one into existence through encode()


def test_replays_are_refused():
    guard = control.ReplayGuard()
    a, b = control.make("version", 1, seq=1), control.make("activate", 0, seq=2)
    assert guard.check(a) and guard.check(b)
    for rec in (a, b):
        with pytest.raises(control.ControlError) as e:
            guard.check(rec)
        assert e.value.reason == "replayed"
    assert control.ReplayGuard(last=2).check(control.make("unpin", None, seq=3))
