"""Feedback in: `/v1/feedback` (on one completion's choice, or on a whole agent session) and Tabby's
`/v1/events` (view | select | dismiss, and our comment | persisted). Each becomes a feedback event keyed like
the completion (or the session) it judges, on disk before the client is answered.

Besides the judgment when a completion is shown (accept | reject | partial), a completion takes two delayed
signals, sent later: `comment` (`text`: the user's words about it, at most 2 KB, no control characters) and
`persisted` (`still_present`, `after_s`, optional `edit_distance`: is the accepted code still in the file).
The trainer joins them to the completion within its window (online_rl.data.join)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from contracts import events as ev
from serving.api.respond import json_response
from serving.auth import TENANT, Tenant
from serving.protocol.schema import (
    ApiError,
    Body,
    Check,
    Field,
    Schema,
    boolean,
    integer,
    number,
    one_of,
    parse_json_body,
    string,
)
from serving.signals import devdata
from serving.signals.sessions import MAX_SESSION_ID

if TYPE_CHECKING:
    from serving.auth import CompletionIds
    from serving.event_log.sink import EventSink
    from serving.metrics import GatewayMetrics
    from serving.routing.dispatcher import Dispatcher
    from serving.signals.first_feedback import FirstFeedback
    from serving.signals.served_index import ServedIndex
    from serving.signals.session_ids import SessionIds
    from serving.signals.sessions import Sessions


def _one_target(b: Body) -> None:
    if ("session_id" in b.given) == ("completion_id" in b.given):
        raise ApiError(
            400,
            "feedback names a 'completion_id' or a 'session_id' (exactly one)",
            param="completion_id",
            code="missing_required_parameter",
        )


def _fields_fit_target(b: Body) -> None:
    if "session_id" in b.given:
        for name in ("choice_index", "accepted_chars"):
            if name in b.given:
                raise ApiError(400, f"'{name}' goes with a completion's feedback, not a session's", param=name)
        _amount_of_partial(b, "score", "a number in [0, 1] (the share of edits kept or tests passed)")
        return
    if "score" in b.given:
        raise ApiError(400, "'score' goes with session feedback (use accepted_chars for a completion)", param="score")
    _amount_of_partial(b, "accepted_chars", "a non-negative integer")


def _amount_of_partial(b: Body, name: str, what: str) -> None:
    """A partial accept says how much was kept (`name`); no other kind does."""
    if b["kind"] == "partial" and name not in b.given:
        raise ApiError(400, f"partial feedback needs '{name}', {what}", param=name, code="invalid_value")
    if b["kind"] != "partial" and name in b.given:
        raise ApiError(400, f"'{name}' only goes with kind=partial", param=name)


_DELAYED_FIELDS = {"comment": ("text",), "persisted": ("still_present", "after_s", "edit_distance")}
_REQUIRED = {"comment": ("text",), "persisted": ("still_present", "after_s")}


def _delayed_fields_fit(b: Body, field: str) -> None:
    """comment takes `text`, persisted `still_present` + `after_s` (+ `edit_distance`); no other kind takes
    any of them. `field` names the kind: `kind` (/v1/feedback) or `type` (Tabby's /v1/events)."""
    kind = b[field]
    for name in _REQUIRED.get(kind, ()):
        if name not in b.given:
            raise ApiError(400, f"{field}={kind} needs '{name}'", param=name, code="missing_required_parameter")
    for other, names in _DELAYED_FIELDS.items():
        for name in names:
            if other != kind and name in b.given:
                raise ApiError(400, f"'{name}' only goes with {field}={other}", param=name)


def _delayed_fields_fit_kind(b: Body) -> None:
    """As _delayed_fields_fit, and neither delayed kind judges a whole session."""
    kind = b["kind"]
    if kind in ev.DELAYED_KINDS and "session_id" in b.given:
        raise ApiError(400, f"kind={kind} judges a completion: name its 'completion_id'", param="session_id")
    _delayed_fields_fit(b, "kind")


def comment_text() -> Check:
    def check(v, name):
        why = ev.comment_problem(v)
        if why is not None:
            raise ApiError(400, why, param=name, code="invalid_value")
        return v

    return check


def _delayed_fields() -> dict[str, Field]:
    return {
        "text": Field(comment_text()),
        "still_present": Field(boolean()),
        "after_s": Field(number(0, 1e9, "'after_s' must be a non-negative number of seconds")),
        "edit_distance": Field(integer(0, 2**62, "invalid_value", "'edit_distance' must be a non-negative integer")),
    }


def feedback_schema(max_n: int) -> Schema:
    return Schema(
        {
            "completion_id": Field(string(nonempty=True)),
            "session_id": Field(string(max_len=MAX_SESSION_ID, printable_ascii=True, nonempty=True)),
            "kind": Field(one_of(*ev.FEEDBACK_KINDS), required=True),
            "choice_index": Field(
                integer(0, max_n - 1, "invalid_value", "'choice_index' must be an integer within n"), 0
            ),
            "accepted_chars": Field(integer(0, 2**62, "invalid_value")),
            "elapsed_ms": Field(number(0, 1e10, "'elapsed_ms' must be a non-negative number")),
            "score": Field(number(0.0, 1.0)),
            **_delayed_fields(),
        },
        rules=(_one_target, _delayed_fields_fit_kind, _fields_fit_target),
    )


def tabby_schema(max_n: int) -> Schema:
    return Schema(
        {
            "type": Field(one_of("view", "select", "dismiss", "comment", "persisted"), required=True),
            "completion_id": Field(string(nonempty=True), required=True),
            "choice_index": Field(
                integer(0, max_n - 1, "invalid_value", "'choice_index' must be an integer within n"), 0
            ),
            "elapsed": Field(number(0, 1e10, "'elapsed' must be a non-negative number (ms)")),
            **_delayed_fields(),  # comment and persisted: the same fields and rules as /v1/feedback's
        },
        rules=(lambda b: _delayed_fields_fit(b, "type"),),
        ignore_unknown=True,  # Tabby sends more (view_id, ...) than it needs here
    )


class FeedbackApi:
    def __init__(
        self,
        max_n: int,
        *,
        ids: CompletionIds,
        sessions: Sessions,
        session_ids: SessionIds,
        served: ServedIndex,
        dispatcher: Dispatcher,
        sink: EventSink,
        metrics: GatewayMetrics,
        first_feedback: FirstFeedback,
        first_session_feedback: FirstFeedback,
    ):
        self.ids, self.sessions, self.session_ids, self.served = ids, sessions, session_ids, served
        self.dispatcher, self.sink, self.metrics = dispatcher, sink, metrics
        self.first_feedback, self.first_session_feedback = first_feedback, first_session_feedback
        self.feedback_body = feedback_schema(max_n)
        self.tabby_body = tabby_schema(max_n)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/feedback", self.feedback),
            web.post("/events", self.tabby_events),
            web.post("/devdata", self.devdata),
        ]

    async def devdata(self, request: web.Request) -> web.Response:
        """Continue's development data (serving.signals.devdata): an event that judges a completion of this key's
        becomes its feedback; anything else is counted and answered 200 (Continue never resends)."""
        tenant: Tenant = request[TENANT]
        e = devdata.read(parse_json_body(await request.read()))
        m = self.metrics.devdata
        if not e.known:
            m.labels("other", "unknown").inc()
            return json_response({"status": "ignored", "outcome": "unknown", "name": e.name[:64]})
        if e.kind is None:
            m.labels(e.name, "no_signal").inc()
            return json_response({"status": "ok", "outcome": "no_signal"})
        if e.name == "toolUsage":
            ref = self.sessions.call_turn(tenant.id, e.data["toolCallId"])
        else:
            d = e.data
            ref = self.served.find(tenant.id, d.get("completion") or "", d.get("prompt"), d.get("suffix"))
        if ref is None:
            m.labels(e.name, "unmatched").inc()
            return json_response({"status": "ok", "outcome": "unmatched"})
        cid, choice = ref
        fb = ev.FeedbackEvent(
            completion_id=cid, choice_index=choice, tenant=tenant.id, kind=e.kind, origin=f"continue:{e.name}"
        )
        await self.log(fb, tenant)
        m.labels(e.name, "joined").inc()
        return json_response({"status": "ok", "outcome": "joined", "completion_id": cid, "kind": e.kind})

    async def feedback(self, request: web.Request) -> web.Response:
        """Feedback on one completion's choice (`completion_id`), or on a whole agent session (`session_id`:
        its outcome, e.g. the edits kept or the tests passed; `kind` partial takes a `score` in [0, 1])."""
        tenant: Tenant = request[TENANT]
        b = self.feedback_body.parse(await request.read())
        if "session_id" in b.given:
            sid = b["session_id"]
            ours = sid.startswith("cmpl-")
            if ours:  # one we derived (a signed completion id): checked like one
                self.ids.check(tenant, sid, param="session_id")
            fb = ev.FeedbackEvent(
                completion_id="",
                choice_index=0,
                tenant=tenant.id,
                kind=b["kind"],
                elapsed_ms=b["elapsed_ms"],
                session_id=self.session_ids.logged(tenant.id, sid, ours),  # a secret in it never leaves
                score=b["score"],
            )
            await self.log(fb, tenant)
            return json_response({"status": "ok", "session_id": sid})
        cid = self.ids.check(tenant, b["completion_id"])
        await self.log(
            ev.FeedbackEvent(
                completion_id=cid,
                choice_index=b["choice_index"],
                tenant=tenant.id,
                kind=b["kind"],
                accepted_chars=b["accepted_chars"],
                elapsed_ms=b["elapsed_ms"],
                text=b["text"],
                still_present=b["still_present"],
                after_s=b["after_s"],
                edit_distance=b["edit_distance"],
            ),
            tenant,
        )
        return json_response({"status": "ok", "completion_id": cid})

    async def tabby_events(self, request: web.Request) -> web.Response:
        """Tabby's /v1/events: view | select | dismiss; `?select_kind=line` makes a select partial."""
        tenant: Tenant = request[TENANT]
        b = self.tabby_body.parse(await request.read())
        cid = self.ids.check(tenant, b["completion_id"])
        if b["type"] == "view":  # shown, not yet judged: the trainer's window decides what silence means
            self.metrics.feedback.labels("view").inc()
            return json_response({"status": "ok"})
        partial = b["type"] == "select" and request.query.get("select_kind") == "line"
        kind = {"dismiss": "reject", "select": "partial" if partial else "accept"}.get(b["type"], b["type"])
        await self.log(
            ev.FeedbackEvent(
                completion_id=cid,
                choice_index=b["choice_index"],
                tenant=tenant.id,
                kind=kind,
                elapsed_ms=b["elapsed"],
                origin="tabby:line" if partial else "tabby",
                text=b["text"],
                still_present=b["still_present"],
                after_s=b["after_s"],
                edit_distance=b["edit_distance"],
            ),
            tenant,
        )
        return json_response({"status": "ok"})

    def signal(self, tenant_id: str, s) -> None:
        """A verdict the gateway read from an agent session (serving.signals.implicit.Signal): a feedback event
        of kind implicit on the completion it judges, counted by signal and version, and on its canary arm.
        Not waited for: it is the gateway's reading, not a client's word it has answered for."""
        fb = ev.FeedbackEvent(
            completion_id=s.completion_id,
            choice_index=s.choice,
            tenant=tenant_id,
            kind=ev.IMPLICIT,
            signal=s.name,
            origin="implicit",
        )
        self.metrics.implicit.labels(s.name).inc()
        self.metrics.versions.judged(s.completion_id, f"implicit_{s.name}")
        if self.dispatcher.canary is not None:
            self.dispatcher.canary.signal(s.completion_id, s.name)
        self.sink.submit(
            ev.TOPIC_FEEDBACK, s.completion_id, fb.encode(), meta={"tenant": tenant_id, "ts": fb.ts, "scan": None}
        )

    async def log(self, fb: ev.FeedbackEvent, tenant: Tenant) -> None:
        m = self.metrics
        scan = None
        deny = self.dispatcher.train_policy(tenant) == "deny"  # its policy now, as for completions
        if fb.text is not None and deny:  # a comment is the tenant's words: not logged
            fb.text, fb.withheld = None, "policy"
        elif fb.text is not None:
            scan = [fb.text]  # the shipper's scrubber removes it if it holds a secret
        if fb.session_id:  # a session's outcome: one per session; the canary votes on completions only
            # Its own memory: client-named session ids cost nothing to make up, and must not push the
            # completions' entries (one canary vote each) out of theirs.
            first = self.first_session_feedback.first(f"{fb.tenant}/{fb.session_id}", -1)
            (m.session_feedback if first else m.feedback_repeated).labels(fb.kind).inc()
        elif fb.kind in ev.DELAYED_KINDS:  # one of each per choice counts; never a canary vote
            first = self.first_feedback.first(f"{fb.kind}/{fb.completion_id}", fb.choice_index)
            (m.feedback if first else m.feedback_repeated).labels(fb.kind).inc()
        elif self.first_feedback.first(fb.completion_id, fb.choice_index):
            m.feedback.labels(fb.kind).inc()
            m.versions.judged(fb.completion_id, fb.kind)
            # The canary takes one vote per completion, whatever its n: a tenant cannot multiply its say.
            canary = self.dispatcher.canary
            if canary is not None and self.first_feedback.first(fb.completion_id, -1):
                canary.feedback(fb.completion_id, fb.kind, tenant.name)
        else:  # logged all the same (the trainer's Joiner also takes only the first), counted apart
            m.feedback_repeated.labels(fb.kind).inc()
        key = fb.session_id or fb.completion_id
        meta = {"tenant": fb.tenant, "ts": fb.ts, "scan": scan}
        await self.sink.wait([self.sink.submit(ev.TOPIC_FEEDBACK, key, fb.encode(), meta=meta)], ev.TOPIC_FEEDBACK)
