"""Continue's development data, read: what each event kind says about a completion served here.

Continue (the open-source IDE assistant) POSTs one JSON body per event to any destination named in the
`data:` section of its config.yaml: `{"name", "data", "schema", "level", "profileId"}` with `Authorization:
Bearer <apiKey>` (checked from the npm package @continuedev/config-yaml 1.42.0 and its DataLogger,
docs/agent-clients.md).
The event carries the prompt Continue sent and the completion it showed, not our completion id; the join is
by those texts (serving.signals.served_index), within the key's own completions.

    event           schema    judgment                             joined by
    autocomplete    0.1/0.2   accepted true: accept, false: reject  prompt + completion text
    chatFeedback    0.1/0.2   feedback true: accept, false: reject  completion text
    editOutcome     0.2       accepted: accept | reject             completion text
    nextEditOutcome 0.2       accepted: accept, aborted: reject     completion text
    toolUsage       0.2       accepted false: reject (the user      the tool call's id (ours)
                              refused the call it made)

The rule for the rest (documented in docs/agent-clients.md): other kinds Continue sends (chatInteraction,
editInteraction, tokensGenerated, nextEditWithHistory, quickEdit) judge nothing and are counted
(`no_signal`), as is an event whose judgment is absent (an autocomplete shown, not yet decided) or whose
texts were not sent (level noCode). A kind this server does not know is counted (`unknown`) and dropped.
Neither is an error: Continue never resends, and a newer client must not fail on an older server. An event
of a known kind with the wrong types is a 400 that says which field.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.protocol.schema import ApiError

# What each kind judging a completion needs, by field: (type, required)
_FIELDS = {
    "autocomplete": {
        "accepted": (bool, False),
        "completion": (str, False),
        "prompt": (str, False),
        "suffix": (str, False),
    },
    "chatFeedback": {"feedback": (bool, False), "completion": (str, False)},
    "editOutcome": {"accepted": (bool, True), "completion": (str, False)},
    "nextEditOutcome": {"accepted": (bool, False), "aborted": (bool, False), "completion": (str, False)},
    "toolUsage": {"toolCallId": (str, True), "accepted": (bool, True), "succeeded": (bool, False)},
}
NO_SIGNAL = ("chatInteraction", "editInteraction", "tokensGenerated", "nextEditWithHistory", "quickEdit")
KINDS = tuple(_FIELDS) + NO_SIGNAL


@dataclass
class DevEvent:
    name: str
    schema: str
    data: dict
    kind: str | None = None  # accept | reject: what it says of its completion (None: nothing)

    @property
    def known(self) -> bool:
        return self.name in KINDS


def read(body: dict) -> DevEvent:
    """The event, checked as far as this server uses it; ApiError 400 naming the field that is wrong."""
    name, schema, data = body.get("name"), body.get("schema", ""), body.get("data")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'name' (the event's kind) must be a non-empty string", param="name", code="invalid_value")
    if not isinstance(schema, str):
        raise ApiError(400, "'schema' must be a version string, e.g. 0.2.0", param="schema", code="invalid_type")
    if not isinstance(data, dict):
        raise ApiError(400, "'data' must be an object (the event's fields)", param="data", code="invalid_type")
    event = DevEvent(name, schema, data)
    texts = {f: (str, False) for f in ("prompt", "completion", "suffix")}  # what the join reads, whatever the kind
    for field, (typ, required) in {**texts, **_FIELDS.get(name, {})}.items() if name in _FIELDS else ():
        v = data.get(field)
        if v is None:
            if required:
                raise ApiError(
                    400, f"{name}: data.{field} is required", param=f"data.{field}", code="missing_required_parameter"
                )
            continue
        if not isinstance(v, typ):
            raise ApiError(
                400, f"{name}: data.{field} must be a {typ.__name__}", param=f"data.{field}", code="invalid_type"
            )
    event.kind = _judgment(name, data)
    return event


def _judgment(name: str, d: dict) -> str | None:
    if name == "autocomplete" and d.get("accepted") is not None:
        return "accept" if d["accepted"] else "reject"
    if name == "chatFeedback" and d.get("feedback") is not None:
        return "accept" if d["feedback"] else "reject"
    if name == "editOutcome":
        return "accept" if d["accepted"] else "reject"
    if name == "nextEditOutcome":
        if d.get("accepted"):
            return "accept"
        return "reject" if d.get("aborted") or d.get("accepted") is False else None
    if name == "toolUsage":
        return None if d["accepted"] else "reject"
    return None
