"""The event contract between serving and online_rl: topics, schemas and their wire format.

Every event is a msgpack map with `schema`, `event_id` and `ts`. Token ids and logprobs travel as
packed little-endian arrays and routed experts as a packed uint8 array with its shape, never as JSON
lists of ints. Completions and their feedback are keyed by completion_id, so both land in the same
partition and a consumer sees a completion before the feedback that follows it. Feedback on a whole agent
session is keyed by its session id instead: it may overtake some of the session's turns (other partitions),
which the consumer allows for (online_rl.data.join).
"""

from __future__ import annotations

import math
import time
import unicodedata
import uuid
from dataclasses import MISSING, dataclass, field, fields

import msgpack
import numpy as np

from contracts.event_checks import REASONS as REASONS, BadRecord, check_fields, completion_arrays, field_rules

TOPIC_COMPLETIONS = "completions"
TOPIC_FEEDBACK = "feedback"
TOPIC_WEIGHTS = "weights"
TOPIC_DEADLETTER = "events.deadletter"  # stubs of events too large for the broker (kept whole on disk)
TOPIC_TENANTS = "tenants"  # each tenant's privacy policy and deletions, keyed by tenant and version (compacted)
# Records a consumer refused (not an event, a wrong type, out of range, unsigned...): each copied here whole, with
# headers naming its topic, partition, offset, the reason and the consumer (infra.dead_letter).
TOPIC_BAD_RECORDS = "records.deadletter"

COMPLETION_SCHEMA = "flywheel.completion.v1"
FEEDBACK_SCHEMA = "flywheel.feedback.v1"
TENANT_SCHEMA = "flywheel.tenant.v1"

# Why an event carries no content (`withheld`): "" it does; "policy" its tenant denies training, so no prompt,
# output, token ids, logprobs or routed experts were logged; "secret" the gateway's scrubber found a secret in
# its prompt, output or comment (serving.event_log.secret_scrub) and removed them before the event left the gateway.
# A withheld event is counted (acceptance, latency, versions) and never trained on.
WITHHELD = ("", "policy", "secret")
TRAIN_POLICIES = ("allow", "deny")

IMMEDIATE_KINDS = ("accept", "reject", "partial")  # the judgment when a completion is shown
# Signals that come later about the same completion: the user's words about it (a hint for distillation),
# and whether it is still in the file after_s seconds on (Cody-style persistence). Completions only.
DELAYED_KINDS = ("comment", "persisted")
FEEDBACK_KINDS = IMMEDIATE_KINDS + DELAYED_KINDS
# What the gateway reads from an agent session itself, for clients that never call /v1/feedback
# (serving.signals.implicit): kind "implicit", `signal` one of these. Never sent by a client.
IMPLICIT = "implicit"
SIGNALS = ("tests_pass", "tests_fail", "revert", "correction", "repeat", "abandoned")
MAX_COMMENT_BYTES = 2048


def comment_problem(text) -> str | None:
    """Why a comment's text is refused (None: it is fine). No control characters at all, line breaks
    included: the text is inserted into the teacher's context as one comment line (online_rl.trainer.loss), and a
    line break there would turn the rest of a user's words into code."""
    if not isinstance(text, str) or not text.strip():
        return "a comment needs a non-empty 'text'"
    if len(text.encode("utf-8", "surrogatepass")) > MAX_COMMENT_BYTES:
        return f"'text' is at most {MAX_COMMENT_BYTES} bytes (UTF-8)"
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") for ch in text):
        return "'text' must not contain control characters (line breaks and tabs included)"
    return None


SOURCES = ("user", "rollout")  # rollout traffic is tagged so it is never mistaken for a user's


def new_event_id() -> str:
    return uuid.uuid4().hex


# A weight version is an int everywhere in Flywheel (events, replica handles, the API, manifests, samples,
# control records): 0 is the base model, then the store's 1, 2, ... SGLang carries it as a string
# (`--weight-version`, `weight_version` in its answers); it is parsed at that boundary, here.
Version = int


def parse_version(v) -> Version | None:
    """A weight version as SGLang or a client reports it: the int, or None when it is not one
    (missing, SGLang's own "default", garbage)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 18:
        return int(v)
    return None


def _spans(spans) -> list:
    """Output-token spans [{version, start, end}] with int versions (SGLang reports them as strings)."""
    if not isinstance(spans, list):
        return []
    return [{**s, "version": parse_version(s.get("version"))} for s in spans if isinstance(s, dict)]


@dataclass
class CompletionEvent:
    completion_id: str
    choice_index: int
    tenant: str  # hashed key id, never the key
    model_version: Version | None  # the version that produced the first output token (None: not reported)
    prompt_ids: np.ndarray  # (P,) int32
    output_ids: np.ndarray  # (N,) int32
    logprobs: np.ndarray  # (N,) float32: behaviour logprob of each output token
    routed_experts: np.ndarray  # (P + N - 1, L, K) uint8: experts of every position the model ran
    sampling: dict  # temperature, top_p, max_tokens, stop, ...
    finish_reason: str
    latency: dict  # ttft_ms, e2e_ms, queue_ms
    weight_versions: list = field(default_factory=list)  # [{version, start, end}] output-token spans
    switch_index: int | None = None  # first output token produced by a later version, if any
    source: str = "user"
    replica: str = ""
    arm: str = ""  # during a canary trial: "canary" or "stable", the arm that served it
    session_id: str = ""  # chat: the agent session this turn belongs to (serving.signals.sessions)
    parent_id: str = ""  # chat: the completion id of the session's previous turn ("" for a first turn)
    cached_tokens: int | None = None  # prompt tokens the replica's prefix cache held (None: it did not say)
    api: str = ""  # the API the client used: completions | chat | responses | messages ("" before it was logged)
    withheld: str = ""  # see WITHHELD: why prompt, output, logprobs and routed experts are empty
    secret_types: list = field(default_factory=list)  # withheld == "secret": what the scrubber found
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=time.time)
    schema: str = COMPLETION_SCHEMA

    def encode(self) -> bytes:
        d = _fields(self)
        experts = np.ascontiguousarray(self.routed_experts, dtype=np.uint8)
        d.update(
            prompt_ids=_pack(self.prompt_ids, "<i4"),
            output_ids=_pack(self.output_ids, "<i4"),
            logprobs=_pack(self.logprobs, "<f4"),
            routed_experts=experts.tobytes(),
            routed_experts_shape=list(experts.shape),
        )
        return msgpack.packb(d, use_bin_type=True)


@dataclass
class FeedbackEvent:
    completion_id: str  # "" when the feedback judges a whole agent session (session_id)
    choice_index: int
    tenant: str
    kind: str  # accept | reject | partial | comment | persisted | implicit
    accepted_chars: int | None = None  # for partial: how much of the completion the user kept
    elapsed_ms: float | None = None  # from showing the completion to the decision
    origin: str = "feedback"  # feedback | tabby (which API the client used)
    session_id: str = ""  # the outcome of a whole agent session (edits kept, tests passed), not of one turn
    score: float | None = None  # a session's partial outcome in [0, 1] (the share of edits kept, of tests passed)
    text: str | None = None  # comment: the user's words about the completion
    still_present: bool | None = None  # persisted: is the accepted code still in the file after_s later
    after_s: float | None = None  # persisted: seconds from the accept to the check
    edit_distance: int | None = None  # persisted: characters the user changed in it since (optional)
    signal: str = ""  # kind implicit: which of SIGNALS the session showed
    withheld: str = ""  # see WITHHELD: a comment whose text was removed ("policy" or "secret")
    secret_types: list = field(default_factory=list)
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=time.time)
    schema: str = FEEDBACK_SCHEMA

    def encode(self) -> bytes:
        return msgpack.packb(_fields(self), use_bin_type=True)


@dataclass
class TenantRecord:
    """A tenant's privacy policy as the gateway holds it, on TOPIC_TENANTS keyed by `key` (the tenant id and the
    policy's version): the record of a tenant's highest version is its policy. `forgotten_before`: every event of
    this tenant with ts at or before it is forgotten (flywheel tenants forget): consumers drop what they hold of
    it and skip it wherever they read it again; the value only ever grows."""

    tenant: str  # the hashed key id events carry
    name: str = ""  # the tenant's name in the key store (operators search by it)
    train: str = "allow"  # allow | deny (deny: events are logged without content and never trained on)
    retention_days: float | None = None  # events older than this are not trained on (None: the topic's own)
    forgotten_before: float | None = None
    event_id: str = field(default_factory=new_event_id)
    ts: float = field(default_factory=time.time)
    schema: str = TENANT_SCHEMA
    # The policy's version (serving.auth.Policy.version, set by the admin action that made it): readers keep
    # the highest, so a gateway re-announcing an older policy from a stale keys file cannot loosen a newer one.
    version: int = 0

    @property
    def key(self) -> str:
        """Its key on the compacted topic. The version is in it so that compaction keeps each version's newest
        record: keyed by tenant alone, a stale gateway's older policy written last would be the only record of
        that tenant left, and a trainer reading the topic from nothing would take it. The topic so keeps one
        record per policy change of each tenant (admin actions: few)."""
        return f"{self.tenant}@{self.version}"

    def encode(self) -> bytes:
        return msgpack.packb(_fields(self), use_bin_type=True)


def _fields(obj) -> dict:
    # Shallow: dataclasses.asdict deep-copies every list, dict and array, on the request path.
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _pack(a, dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


_COMPLETION_FIELDS = {f.name for f in fields(CompletionEvent)} | {"routed_experts_shape"}
_FEEDBACK_FIELDS = {f.name for f in fields(FeedbackEvent)}
_TENANT_FIELDS = {f.name for f in fields(TenantRecord)}
# What "withheld" empties in a completion event: everything derived from the code it saw or wrote.
_CONTENT = {"prompt_ids": b"", "output_ids": b"", "logprobs": b"", "routed_experts": b""}


SchemaError = BadRecord  # the name consumers used first


def _check_feedback(f: FeedbackEvent) -> None:
    """What a consumer relies on: one bad record must be counted and skipped, never crash it (on every
    replay after a restart)."""
    if not isinstance(f.completion_id, str) or not isinstance(f.session_id, str) or not isinstance(f.tenant, str):
        raise SchemaError("feedback ids are not strings")
    if bool(f.completion_id) == bool(f.session_id):
        raise SchemaError("feedback names a completion or a session, exactly one")
    if f.kind not in FEEDBACK_KINDS and f.kind != IMPLICIT:
        raise SchemaError(f"unknown feedback kind {f.kind!r}")
    if (f.kind == IMPLICIT) != bool(f.signal) or (f.signal and f.signal not in SIGNALS):
        raise SchemaError(f"an implicit feedback names one of {SIGNALS} (and only it does), not {f.signal!r}")
    if isinstance(f.choice_index, bool) or not isinstance(f.choice_index, int):
        raise SchemaError("choice_index is not an int")
    if f.score is not None and (
        isinstance(f.score, bool) or not isinstance(f.score, (int, float)) or not 0.0 <= f.score <= 1.0
    ):
        raise SchemaError("score is not a number in [0, 1]")
    if f.accepted_chars is not None and (isinstance(f.accepted_chars, bool) or not isinstance(f.accepted_chars, int)):
        raise SchemaError("accepted_chars is not an int")
    if f.kind in DELAYED_KINDS and f.session_id:
        raise SchemaError(f"{f.kind} feedback judges a completion, not a session")
    if f.withheld not in WITHHELD:
        raise SchemaError(f"withheld is {f.withheld!r}")
    if f.kind == "comment" and not f.withheld and (why := comment_problem(f.text)) is not None:
        raise SchemaError(why)
    if f.kind == "persisted":
        if not isinstance(f.still_present, bool):
            raise SchemaError("persisted feedback needs still_present (a bool)")
        if isinstance(f.after_s, bool) or not isinstance(f.after_s, (int, float)) or not math.isfinite(f.after_s):
            raise SchemaError("persisted feedback needs after_s (a number)")
        if f.after_s < 0:
            raise SchemaError("after_s is negative")
    if f.edit_distance is not None and (
        isinstance(f.edit_distance, bool) or not isinstance(f.edit_distance, int) or f.edit_distance < 0
    ):
        raise SchemaError("edit_distance is not a non-negative int")


def _check_tenant(t: TenantRecord) -> None:
    if not isinstance(t.tenant, str) or not t.tenant:
        raise SchemaError("a tenant record names its tenant id")
    if t.train not in TRAIN_POLICIES:
        raise SchemaError(f"train is {t.train!r}, not one of {TRAIN_POLICIES}")
    if isinstance(t.version, bool) or not isinstance(t.version, int) or t.version < 0:
        raise SchemaError("version is not a non-negative int")
    for name in ("retention_days", "forgotten_before"):
        v = getattr(t, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            raise SchemaError(f"{name} is not a non-negative number")


def withhold(raw: bytes, reason: str, secret_types=()) -> bytes:
    """An encoded completion or feedback event without its content: token ids, logprobs and routed experts
    (completion), or a comment's text (feedback), flagged `withheld=reason`. Ids, tenant, version, timing and
    the judgment stay, so the event is still counted. Anything else is returned as it was."""
    d = msgpack.unpackb(raw, raw=False)
    if not isinstance(d, dict) or d.get("schema") not in (COMPLETION_SCHEMA, FEEDBACK_SCHEMA):
        return raw
    if d["schema"] == COMPLETION_SCHEMA:
        shape = d.get("routed_experts_shape") or [0]
        d.update(_CONTENT, routed_experts_shape=[0, *shape[1:]])  # (0, layers, top_k), as a deny logs it
        # Stop strings are the client's text too; the numbers (temperature, max_tokens, ...) are not.
        d["sampling"] = {k: v for k, v in (d.get("sampling") or {}).items() if not isinstance(v, (str, list))}
    else:
        d["text"] = None
    d.update(withheld=reason, secret_types=sorted(secret_types))
    return msgpack.packb(d, use_bin_type=True)


_SCHEMAS = {  # schema -> (its class, its decoding rules, the topic that carries it)
    COMPLETION_SCHEMA: (CompletionEvent, field_rules(CompletionEvent), TOPIC_COMPLETIONS),
    FEEDBACK_SCHEMA: (FeedbackEvent, field_rules(FeedbackEvent), TOPIC_FEEDBACK),
    TENANT_SCHEMA: (TenantRecord, field_rules(TenantRecord), TOPIC_TENANTS),
}
_REQUIRED = {
    schema: {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    for schema, (cls, _, _) in _SCHEMAS.items()
}


def decode(raw: bytes, topic: str | None = None) -> CompletionEvent | FeedbackEvent | TenantRecord:
    """The event a record holds, every field of the type and in the range its consumers rely on; BadRecord (with
    its reason) otherwise. `topic`: the topic it was read from, which must be the one its kind goes to."""
    if raw is None:
        raise BadRecord("no value (a tombstone)", "tombstone")
    try:
        d = msgpack.unpackb(raw, raw=False)
    except Exception as e:  # garbage: any of msgpack's errors, a non-string map key, bytes that are not UTF-8
        raise BadRecord(f"not msgpack: {type(e).__name__}", "not_msgpack") from None
    if not isinstance(d, dict):
        raise BadRecord(f"event is {type(d).__name__}, not a map", "not_a_map")
    schema = d.get("schema")
    if not isinstance(schema, str) or schema not in _SCHEMAS:
        raise BadRecord(f"unknown schema {str(schema)[:64]!r}", "unknown_schema")
    cls, rules, home = _SCHEMAS[schema]
    if topic is not None and topic != home:
        raise BadRecord(f"a {schema} event on the {topic} topic (its topic is {home})", "wrong_topic")
    # Fields this reader does not know are dropped, not refused: a producer one release ahead (new optional
    # fields, same schema) must not make its events unreadable to consumers still on the old one.
    known = _COMPLETION_FIELDS if cls is CompletionEvent else {f.name for f in fields(cls)}
    d = {k: v for k, v in d.items() if k in known}
    need = _REQUIRED[schema] | ({"routed_experts_shape"} if cls is CompletionEvent else set())
    if missing := sorted(need - d.keys()):
        raise BadRecord(f"{schema}: missing {missing}", "missing_field")
    check_fields(d, rules, time.time())
    if cls is CompletionEvent:
        completion_arrays(d)
        # Events written before versions were ints carry them as strings.
        d["model_version"] = parse_version(d.get("model_version"))
        d["weight_versions"] = _spans(d.get("weight_versions", []))
    event = cls(**d)
    if cls is FeedbackEvent:
        _check_feedback(event)
    elif cls is TenantRecord:
        _check_tenant(event)
    return event
