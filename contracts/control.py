"""Control records on the `weights` topic: what the fleet serves (version, canary, promote, rollback,
activate, pin, unpin), and the eval gate's verdict on a version before it is announced (gate: pass, block,
or an SRE's override, with its figures). The one module that says what they are.

The broker is not authenticated, so every record is signed by the trainer's ed25519 key (the key that
signs manifests) and carries a sequence number that only grows (publishers take it from the store
under a lock and send while they hold it, so topic order is sequence order). Consumers verify the
signature and the record's fields before acting, and refuse a record whose sequence number they have
already passed (a replay of an old pin). Anything else (not JSON, not an object, null, an unknown kind,
a field of the wrong type, unsigned, signed by another key) raises ControlError, which consumers count
and skip: never a crash, never an offset that replays it forever.

Wire format: {"record": {...}, "sig": base64(ed25519(canonical JSON of the record)), "signer": key id}.
Versions are plain ints everywhere.
"""

from __future__ import annotations

import base64
import json
import math
import time
from typing import TypeGuard

SCHEMA = "flywheel.control/1"
MAX_RECORD_BYTES = 64 << 10  # a control record is a few hundred bytes; anything far larger is refused unread
KINDS = ("version", "canary", "promote", "rollback", "activate", "pin", "unpin", "gate")
VERDICTS = ("pass", "block", "override")  # a gate record's verdict

# Optional fields by type (name -> accepted types); "version" is an int on every kind but unpin.
_FIELDS = {
    "reason": (str,),
    "stable": (int,),
    "replicas": (list,),
    "canary": (bool,),
    "share": (int, float),
    "base_version": (int, type(None)),
    "kind": (str,),
    "manifest": (str,),
    "manifest_digest": (str,),
    "signer": (str,),
    "figures": (dict,),
    "trial_s": (int, float),
    "ts": (int, float),
    "verdict": (str,),
    "by": (str,),
}


REASONS = ("malformed", "unsigned", "bad_signature", "invalid", "replayed")  # why a record is refused


class ControlError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # one of REASONS


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def validate(record) -> dict:
    """The record if its fields are what its kind needs; ControlError("invalid") otherwise."""
    if not isinstance(record, dict):
        raise ControlError("invalid", f"a record is an object, not {type(record).__name__}")
    kind = record.get("type")
    if kind not in KINDS:
        raise ControlError("invalid", f"unknown kind {kind!r}")
    if not _is_int(record.get("seq")) or record["seq"] < 1:
        raise ControlError("invalid", "no sequence number")
    v = record.get("version")
    if kind != "unpin" and (not _is_int(v) or v < 0):
        raise ControlError("invalid", f"{kind} without an integer version")
    for name, types in _FIELDS.items():
        if name in record and not (isinstance(record[name], types) and (types != (int,) or _is_int(record[name]))):
            raise ControlError("invalid", f"{kind}: field {name!r} is not {'/'.join(t.__name__ for t in types)}")
    if kind == "gate" and record.get("verdict") not in VERDICTS:
        raise ControlError("invalid", f"gate: verdict {record.get('verdict')!r} is not one of {VERDICTS}")
    if "replicas" in record and not all(isinstance(r, str) for r in record["replicas"]):
        raise ControlError("invalid", "replicas are names")
    if any(isinstance(v, float) and not math.isfinite(v) for v in record.values()):  # JSON as Python writes it
        raise ControlError("invalid", f"{kind}: a number that is not finite")
    return record


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def make(kind: str, version: int | None, seq: int, **fields) -> dict:
    return validate({"schema": SCHEMA, "type": kind, "version": version, "seq": seq, "ts": time.time(), **fields})


def encode(record: dict, private_key, signer: str = "") -> bytes:
    """The signed wire form of a record (validated first)."""
    validate(record)
    sig = private_key.sign(_canonical(record))
    return json.dumps({"record": record, "sig": base64.b64encode(sig).decode(), "signer": signer}).encode()


def decode(raw: bytes, public_key) -> dict:
    """The verified record, or ControlError saying why not."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(raw, (bytes, bytearray, str)) or len(raw) > MAX_RECORD_BYTES:
        raise ControlError("malformed", "not bytes, or too large to be a control record")
    try:
        wire = json.loads(raw)
    except Exception as e:  # ValueError, but also RecursionError from "[[[[..." nested ten thousand deep
        raise ControlError("malformed", f"not JSON ({type(e).__name__})") from None
    if not isinstance(wire, dict):
        raise ControlError("malformed", f"not an object but {type(wire).__name__}")
    if not isinstance(wire.get("sig"), str) or "record" not in wire:
        raise ControlError("unsigned", "no signature")
    record = wire["record"]
    if not isinstance(record, dict):
        raise ControlError("malformed", "the signed record is not an object")
    try:
        public_key.verify(base64.b64decode(wire["sig"], validate=True), _canonical(record))
    except (InvalidSignature, ValueError, TypeError, RecursionError) as e:
        raise ControlError("bad_signature", f"does not verify with our key ({type(e).__name__})") from None
    return validate(record)


class ReplayGuard:
    """Accepts each sequence number once, in increasing order. `last` is what a consumer persists together
    with the offsets it commits (so records it has not committed are read, and accepted, again)."""

    def __init__(self, last: int = 0):
        self.last = last

    def check(self, record: dict) -> dict:
        if record["seq"] <= self.last:
            raise ControlError("replayed", f"sequence {record['seq']} is not after {self.last}")
        self.last = record["seq"]
        return record
