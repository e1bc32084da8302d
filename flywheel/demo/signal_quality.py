"""How well each implicit signal (serving.signals.implicit) tells the truth, against a simulated population
that knows it (flywheel.demo.agent_session.UserModel): the benchmark's and the demo's figures.

A session's truth is per turn: whether the file that turn left passes the hidden tests (a write: whether what
it wrote does). For each signal:

  precision   of the turns it named, the share whose truth agrees (bad, for every signal but tests_pass;
              good, for tests_pass)
  recall      of the turns it is about, the share it named: writes of that truth (tests_pass; tests_fail and
              revert: bad writes), the last turn of sessions the user walked away from (abandoned), the bad
              answers (correction, repeat); `any_negative`: every bad turn against every negative signal
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from contracts import events as ev


@dataclass
class SessionTruth:
    completion_ids: list  # in turn order (Messages API ids: msg_ + the completion id)
    truth: dict  # completion id -> good
    writes: list  # completion ids of the turns that wrote the file
    abandoned: bool = False


def _cid(x: str) -> str:
    return x.removeprefix("msg_").removeprefix("resp_")


def score(sessions: Iterable[SessionTruth], named: Iterable[tuple[str, str]]) -> dict:
    """named: (signal, completion id) of every implicit feedback event."""
    truth, writes, answers, abandoned = {}, set(), set(), set()
    for s in sessions:
        ids = [_cid(c) for c in s.completion_ids]
        truth.update({_cid(c): g for c, g in s.truth.items()})
        written = {_cid(c) for c in s.writes}
        writes |= written
        answers |= {c for c in ids if c not in written}
        if s.abandoned and ids:
            abandoned.add(ids[-1])
    by_signal: dict[str, set] = {}
    for name, cid in named:
        by_signal.setdefault(name, set()).add(_cid(cid))
    out = {}
    for name in ev.SIGNALS:
        got = {c for c in by_signal.get(name, set()) if c in truth}
        good = name == "tests_pass"
        if name.startswith("tests_") or name == "revert":  # these name the session's last edit
            about = {c for c in writes if truth.get(c) == good}
        elif name == "abandoned":
            about = abandoned
        else:
            about = {c for c in answers if truth.get(c) is False}
        right = {c for c in got if truth[c] == good}
        out[name] = {
            "named": len(got),
            "precision": round(len(right) / len(got), 3) if got else None,
            "recall": round(len(got & about) / len(about), 3) if about else None,
        }
    negative = set().union(*(by_signal.get(n, set()) for n in ev.SIGNALS if n != "tests_pass")) & set(truth)
    bad = {c for c, g in truth.items() if not g}
    out["any_negative"] = {
        "named": len(negative),
        "precision": round(len(negative & bad) / len(negative), 3) if negative else None,
        "recall": round(len(negative & bad) / len(bad), 3) if bad else None,
    }
    return {"turns": len(truth), "bad_turns": len(bad), "signals": out}
