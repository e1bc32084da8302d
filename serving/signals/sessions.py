"""Which agent session a chat request continues, and which completion produced the turn before it.

An agent client sends the whole conversation every turn. The gateway links a request to its previous
turn three ways, the first that answers wins:
- a `tool` message answering a call this gateway issued (call ids are ours: `call_<hex>`);
- the conversation up to its last assistant message, hashed (with the tenant), as this gateway answered it;
- nothing: the request starts a session, named by its own completion id.
The session id itself can be given by the client (`X-Session-Id` header or `metadata.session_id`); else it
is the one of the previous turn. What is remembered is bounded (least recently used first out) and per
gateway process: a fleet behind several gateways links turns that land on the same one, or clients send
the header (and the previous completion id is then still found whenever it is known here).

The calls a session's answers made are remembered the same way (bounded, per process), so that a call
identical to an earlier one of the session is counted as repeated (`flywheel_gateway_tool_calls_repeated`:
an agent looping on the same call is a reward-hacking sign).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSION_ID = 128


@dataclass
class Link:
    session_id: str
    parent_id: str  # the completion id of the previous turn ("" when none is known)
    logged_id: str = ""  # the session id as events carry it (serving.signals.session_ids: a secret in it never leaves)


def _canonical(m: dict) -> list:
    """One message as it matters for identity: role, text, calls (name and parsed arguments)."""
    calls = []
    for c in m.get("calls", []):
        try:
            args = json.loads(c["arguments"])
        except (ValueError, RecursionError):  # a client's arguments, as sent (nested past recursion too)
            args = c["arguments"]
        calls.append([c["name"], args])
    return [m["role"], m.get("content") or "", calls, m.get("tool_call_id", "")]


def _key(tenant: str, messages: list[dict]) -> str:
    raw = json.dumps([tenant, [_canonical(m) for m in messages]], sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def _call_key(tenant: str, session_id: str, name: str, arguments: str) -> bytes:
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):
        args = arguments
    raw = json.dumps([tenant, session_id, name, args], sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(raw.encode(), digest_size=16).digest()


class Sessions:
    def __init__(self, max_entries: int = 200_000, max_calls: int = 100_000):
        self.max_entries = max_entries
        self._turns: OrderedDict[str, tuple[str, str]] = OrderedDict()  # key -> (completion id, session id)
        self.max_calls = max_calls
        self._calls: OrderedDict[bytes, tuple[str, int]] = OrderedDict()  # call digest -> (completion id, choice)

    def _get(self, key: str) -> tuple[str, str] | None:
        hit = self._turns.get(key)
        if hit is not None:
            self._turns.move_to_end(key)
        return hit

    def _put(self, key: str, value: tuple[str, str]) -> None:
        self._turns[key] = value
        self._turns.move_to_end(key)
        while len(self._turns) > self.max_entries:
            self._turns.popitem(last=False)

    def link(self, tenant: str, messages: list[dict], given: str | None, completion_id: str) -> Link:
        """messages: serving.protocol.openai's checked messages (role, content, calls, tool_call_id)."""
        hit = None
        for m in reversed(messages):  # the tool results of this turn: those after the last assistant message
            if m["role"] == "assistant":
                break
            if m["role"] == "tool" and (hit := self._get(f"call:{tenant}:{m.get('tool_call_id')}")):
                break
        if hit is None:
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
            if last is not None:
                hit = self._get(_key(tenant, messages[: last + 1]))
        parent, session = hit if hit is not None else ("", completion_id)
        return Link(session_id=given or session, parent_id=parent)

    def record(self, tenant: str, messages: list[dict], answer: dict, completion_id: str, session_id: str) -> None:
        """Remember an answer (one choice: the assistant message the client may send back next turn)."""
        self._put(_key(tenant, messages + [answer]), (completion_id, session_id))
        for c in answer.get("calls", []):
            self._put(f"call:{tenant}:{c['id']}", (completion_id, session_id))

    def call_turn(self, tenant: str, call_id: str) -> tuple[str, int] | None:
        """The completion (id, choice) whose answer made the tool call `call_id`, if this gateway remembers it."""
        hit = self._turns.get(f"call:{tenant}:{call_id}")
        if hit is None:
            return None
        cid, _, choice = hit[0].rpartition(":")
        return (cid, int(choice)) if choice.isdigit() else None

    def repeated_calls(self, tenant: str, session_id: str, calls: list[dict], completion_id: str, choice: int) -> int:
        """How many of an answer's calls (OpenAI tool_calls) repeat a call made earlier in the same session:
        same tool, same arguments compared as JSON (key order and spacing aside). Remembers them.

        Earlier means by another request of the session, or twice within this answer; the other choices of
        the same request (n > 1) are alternatives, not earlier calls. The memory is bounded (least recently
        used first out, `max_calls` calls over all sessions) and per gateway process, like the turns."""
        repeated, here = 0, set()
        for c in calls:
            key = _call_key(tenant, session_id, c["function"]["name"], c["function"]["arguments"])
            if key in here:  # twice within this answer
                repeated += 1
                continue
            here.add(key)
            first = self._calls.get(key)
            if first is None:
                self._calls[key] = (completion_id, choice)
                while len(self._calls) > self.max_calls:
                    self._calls.popitem(last=False)
                continue
            self._calls.move_to_end(key)
            if first[0] != completion_id or first[1] == choice:
                repeated += 1
        return repeated
