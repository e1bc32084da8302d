"""Verdicts an agent session carries without the client ever calling /v1/feedback: what the client sends on
the next turn says how the last one went.

    signal       on                       read from
    tests_pass   the session's last edit  a test run's result after it (run_tests, pytest, python3 test_*.py,
    tests_fail                            npm/go/cargo test...): passed, or failed / errored / non-zero exit
    revert       the session's last edit  a call undoing it (git checkout/restore/stash/reset, the file
                                          written back as it was before the edit), or the user asking to undo it
    correction   the answer before it     the user's next words reject it ("no", "wrong", "still fails", ...)
    repeat       the answer before it     the user sends the same request again (text similarity >= 0.8)
    abandoned    the last turn            the answer asked for tool results that did not come within
                                          `abandon_after_s`: the user stopped the agent mid-task (if they
                                          come later after all, they are read as usual)

An edit is a call that writes a file: write_file / Write / Edit / apply_patch, or a shell command that
redirects into a file, a heredoc, `sed -i`, `tee`. Each signal is its own reward component (weights in
online_rl.config.RewardTable.signals) and its own series (flywheel_gateway_implicit_signals_total), so the
trainer, the canary and the dashboards see them apart; precision and recall against a simulated population
that knows the truth: benchmarks/implicit_signals.py.

State is per session and per gateway process, bounded (least recently used out; files by digest, a user's
message by its head and tail), like serving.signals.sessions: a session whose turns land on several gateways is read
by each as far as it saw it. Each (turn, signal) is logged once: a request retried after a failure carries the
same results again.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from contracts.events import SIGNALS

POSITIVE = ("tests_pass",)

_TEST_CMD = re.compile(
    r"(\bpytest\b|\bpython3?\s+(-m\s+)?(unittest|pytest)\b|\bpython3?\s+\S*test\S*\.py\b|\b(npm|yarn|pnpm)\s+(run\s+)?test\b"
    r"|\bgo\s+test\b|\bcargo\s+test\b|\bmake\s+(test|check)\b|\btox\b|\bnox\b)"
)
_WRITE_CMD = re.compile(r"(<<\s*['\"]?\w+|(^|[^<>0-9&])>\s*[\w./-]+|\bsed\s+-i\b|\btee\b|\bperl\s+-pi\b)")
_REVERT_CMD = re.compile(r"\bgit\s+(checkout\s+(--\s+)?\S|restore\b|stash\b|reset\s+--hard\b|revert\b)")
_FAILED = re.compile(
    r"(\b[1-9]\d*\s+(failed|errors?)\b|\bFAILED\b|\bTraceback\b|\bAssertionError\b|\bError:|exited with code [1-9])"
)
_PASSED = re.compile(r"(\b[1-9]\d*\s+passed\b|^OK\b|\bok\b|\bPASS\b|exited with code 0)", re.M)
_UNDO = re.compile(r"\b(undo|revert|roll\s*back|put it back|restore it)\b", re.I)
_CORRECTION = re.compile(
    r"(^\s*(no|nope|wrong)\b|\bthat'?s (wrong|not (it|right|what))|\bnot what i\b|\b(doesn'?t|does not|didn'?t|did not)"
    r" (work|pass|compile|run)|\bstill (fail|broken|wrong|not)|\bincorrect\b|\byou broke\b|\bbroke (it|the)\b"
    r"|\btry again\b)",
    re.I,
)
EDIT_TOOLS = ("write_file", "write", "edit", "multiedit", "apply_patch", "create_file", "str_replace_editor")


@dataclass
class Signal:
    name: str  # one of SIGNALS
    completion_id: str
    choice: int

    def __post_init__(self):
        if self.name not in SIGNALS:
            raise ValueError(f"unknown signal {self.name!r}")


MAX_PATHS = 64  # files remembered per session (a path and its content by digest: the model writes both)
MAX_NAMED = 64  # (turn, signal) pairs remembered per session: a retry repeats a recent turn, not an old one
MAX_TEXT = 8192  # characters of a user's message read (its head and tail): matching stays cheap on any input


@dataclass
class _Session:
    last: str = ""  # "cid:choice" of the latest answer
    edit: str = ""  # of the latest answer that edited a file
    # call id -> (name, {path, command}) of the latest answer
    calls: dict[str, tuple[str, dict]] = field(default_factory=dict)
    awaiting: bool = False  # the latest answer called tools: their results are due
    seen: float = field(default_factory=time.monotonic)
    known: dict = field(default_factory=dict)  # path digest -> digest of its content as last read or written
    before: dict = field(default_factory=dict)  # path digest -> of its content before the last edit (a revert)
    named: dict = field(default_factory=dict)  # (completion ref, signal) already logged (the newest MAX_NAMED)

    def remember(self, path: bytes | None, content: str) -> None:
        if path is not None:
            self.known.pop(path, None)
            self.known[path] = _digest(content)
            while len(self.known) > MAX_PATHS:
                self.known.pop(next(iter(self.known)))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _path(path) -> bytes | None:
    """A path as a session keeps it: by digest (the model writes it, at any length)."""
    return _digest(path) if isinstance(path, str) else None


def _ref(ref: str) -> tuple[str, int]:
    cid, _, choice = ref.rpartition(":")
    return cid, int(choice) if choice.isdigit() else 0


def call_args(arguments: str | dict) -> dict:
    """A tool call's arguments as a dict, whether sent as JSON text or already parsed ({} when not an object)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        v = json.loads(arguments)
    except (TypeError, ValueError, RecursionError):
        return {}
    return v if isinstance(v, dict) else {}


def _command(name: str, args: dict) -> str:
    """The shell command a call runs, if it is a shell call ("" otherwise)."""
    for key in ("command", "cmd", "script"):
        v = args.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return " ".join(v)
    return ""


def is_edit(name: str, args: dict) -> bool:
    return name.lower() in EDIT_TOOLS or bool(_WRITE_CMD.search(_command(name, args)))


def is_test(name: str, args: dict) -> bool:
    return name.lower() in ("run_tests", "test", "run_test") or bool(_TEST_CMD.search(_command(name, args)))


_TAGGED = re.compile(r"<([\w-]{1,40})>[\s\S]*?</\1>")


def _words(text: str) -> str:
    """A user's own words: tagged blocks a client adds (Claude Code's <system-reminder>, Codex's
    <environment_context>) removed, lower case, spaces collapsed; read from its head and tail only."""
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT // 2] + "\n" + text[-MAX_TEXT // 2 :]
    return " ".join(_TAGGED.sub(" ", text).lower().split())


class ImplicitSignals:
    def __init__(self, abandon_after_s: float = 600.0, capacity: int = 100_000):
        self.abandon_after_s, self.capacity = abandon_after_s, capacity
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()

    def _get(self, tenant: str, session: str) -> _Session | None:
        s = self._sessions.get((tenant, session))
        if s is not None:
            self._sessions.move_to_end((tenant, session))
        return s

    def observe(self, tenant: str, session: str, parent: str, messages: list[dict]) -> list[Signal]:
        """A new turn of `session` (its previous answer `parent`, "cid:choice"): the signals in what the
        client sent since that answer. messages: serving.protocol.openai's checked messages."""
        s = self._get(tenant, session)
        if s is None or not parent or parent != s.last:
            return []  # a turn this gateway did not answer, or a branch off an older one
        last_answer = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        new = messages[last_answer + 1 :]
        out: list[Signal] = []
        s.awaiting = False
        for m in new:
            if m["role"] == "tool" and m.get("tool_call_id") in s.calls:
                out += self._tool_result(s, *s.calls[m["tool_call_id"]], m["content"])
        users = [m for m in new if m["role"] == "user" and m["content"].strip()]
        if users:
            out += self._user_turn(
                s, users[-1]["content"], [m for m in messages[: last_answer + 1] if m["role"] == "user"]
            )
        return self._new(s, out)

    def _tool_result(self, s: _Session, name: str, args: dict, result: str) -> list[Signal]:
        cmd = args.get("command", "")
        if name.lower() in ("read_file", "read"):
            s.remember(args.get("path"), result)
        if cmd.strip().startswith("cat ") and len(cmd.split()) == 2:
            s.remember(_path(cmd.split()[1]), result)
        if not s.edit:
            return []
        if is_test(name, args):
            tail = result[-MAX_TEXT:]  # a test run's verdict is at its end
            failed = bool(_FAILED.search(tail))
            if failed or _PASSED.search(tail):
                return [Signal("tests_fail" if failed else "tests_pass", *_ref(s.edit))]
        return []

    def _user_turn(self, s: _Session, text: str, earlier: list[dict]) -> list[Signal]:
        on = _ref(s.last)
        words = _words(text)
        if _UNDO.search(words) and s.edit:
            return [Signal("revert", *_ref(s.edit))]
        if _CORRECTION.search(words):
            return [Signal("correction", *on)]
        if earlier:
            a = _words(earlier[-1]["content"])
            if a and words and difflib.SequenceMatcher(None, a[:2000], words[:2000]).ratio() >= 0.8:
                return [Signal("repeat", *on)]
        return []

    def answered(self, tenant: str, session: str, ref: str, calls: list[dict]) -> list[Signal]:
        """The answer `ref` ("cid:choice") of `session` and its calls ({id, name, arguments}); returns the
        signals the calls themselves carry (one undoing the session's last edit)."""
        key = (tenant, session)
        s = self._get(tenant, session)
        if s is None:
            s = self._sessions[key] = _Session()
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
        out = []
        parsed = [(c["id"], c["name"], call_args(c["arguments"])) for c in calls]
        for _, name, args in parsed:
            content, path = args.get("content"), _path(args.get("path") or args.get("file_path"))
            written = _digest(content) if isinstance(content, str) else None
            restores = written is not None and s.before.get(path) == written != s.known.get(path)
            if s.edit and (_REVERT_CMD.search(_command(name, args)) or restores):
                out.append(Signal("revert", *_ref(s.edit)))
        s.last, s.awaiting, s.seen = ref, bool(parsed), time.monotonic()
        # what a result will be read against: the tool, its file, its command (never a file's content)
        s.calls = {
            i: (
                name,
                {"path": _path(args.get("path") or args.get("file_path")), "command": _command(name, args)[:MAX_TEXT]},
            )
            for i, name, args in parsed
        }
        edits = [args for _, name, args in parsed if is_edit(name, args)]
        if edits:
            s.edit = ref
            paths = [_path(a.get("path") or a.get("file_path")) for a in edits]
            s.before = {p: s.known[p] for p in paths if p in s.known}  # what this edit replaced
            for a in edits:
                if isinstance(a.get("content"), str):
                    s.remember(_path(a.get("path") or a.get("file_path")), a["content"])
        return self._new(s, out)

    @staticmethod
    def _new(s: _Session, signals: list[Signal]) -> list[Signal]:
        """Each (turn, signal) once per session: a request retried after a failure carries the same results."""
        out = [x for x in signals if (x.completion_id, x.choice, x.name) not in s.named]
        for x in out:
            s.named[(x.completion_id, x.choice, x.name)] = None
        while len(s.named) > MAX_NAMED:
            s.named.pop(next(iter(s.named)))
        return out

    def sweep_keyed(self, now: float | None = None) -> list[tuple[tuple[str, str], Signal]]:
        """Sessions left waiting for tool results longer than abandon_after_s: abandoned, ((tenant, session),
        signal) each. Such a session is kept (its results may still come: read as usual then); one idle ten
        times as long (at least an hour) is forgotten."""
        now = time.monotonic() if now is None else now
        out = []
        forget = max(10 * self.abandon_after_s, 3600.0)
        for key, s in list(self._sessions.items()):
            if s.awaiting and now - s.seen > self.abandon_after_s:
                s.awaiting = False
                out += [(key, x) for x in self._new(s, [Signal("abandoned", *_ref(s.last))])]
            if now - s.seen > forget:
                del self._sessions[key]
        return out
