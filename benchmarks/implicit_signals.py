"""Precision and recall of each implicit signal (serving.signals.implicit) against a simulated population
that knows the truth.

Agent users (flywheel.demo.agent_session with its UserModel: corrections, repeats, undos, new requests, "no
worries", walking away mid-task) run sessions over the Messages API against a gateway in this process. The
replica is a scripted policy that works like the agent episodes (read, write, run the tests, answer), writing
the task's reference body half the time and one of its wrong bodies otherwise, so good and bad turns come in
known proportions. Every turn's truth is whether the file it left passes the hidden tests (a write: whether
what it wrote does). The gateway's implicit feedback events (its spool) are joined to that truth by
completion id.

precision and recall as flywheel.demo.signal_quality defines them.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import tempfile
from collections import Counter
from pathlib import Path

from contracts import events as ev
from flywheel.demo import signal_quality
from flywheel.demo.agent_session import UserModel, messages_transport, run_session
from flywheel.demo.signal_quality import SessionTruth
from online_rl.model import bootstrap as B
from online_rl.tasks import synthetic as T
from serving.event_log.spool import Spool
from tests.fake_engine import gateway_over_fakes

_CALL = re.compile(r'<tool_call>\n\{"name": "(\w+)"')


class ScriptedPolicy:
    """The replica's answer, from the conversation it is sent: the agent episode's next step."""

    def __init__(self, tokenizer, good_share: float, seed: int):
        self.tok, self.good_share, self.rng = tokenizer, good_share, random.Random(seed)
        self.tasks = T.tasks("heldout")

    def __call__(self, input_ids: list[int]) -> str:
        prompt = self.tok.decode(input_ids, skip_special_tokens=False)
        tail = prompt[prompt.rfind("# user:") :]
        asked = re.search(r"# user: .*?(\w+\.py)", prompt)  # the file the session is about: the first request's
        path = asked.group(1) if asked else "app.py"
        calls = _CALL.findall(tail)
        last = calls[-1] if calls else None
        if last is None:
            return _call("read_file", {"path": path})
        if last == "read_file":
            task = next((t for t in self.tasks if t.prompt in prompt), None)
            if task is None:
                return "I could not read it."
            body = task.reference if self.rng.random() < self.good_share else self.rng.choice(task.wrong_bodies())
            return _call("write_file", {"path": path, "content": task.prompt + body})
        if last == "write_file":
            return _call("run_tests", {"path": path})
        result = tail[tail.rfind("<tool_response>") :]
        return "Done: the tests pass." if "failed" not in result else "The tests still fail."


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _judge(task: T.Task, code: str) -> tuple[int, int]:
    """The hidden tests, in this process (the scripted policy writes only the task's own bodies)."""
    from online_rl.tasks.agent_episodes import _failures

    body = code.removeprefix(task.prompt)
    try:
        failed = _failures(task, body)
    except Exception:  # noqa: BLE001 - a body that does not run passes nothing
        return 0, len(task.test_inputs())
    n = len(task.test_inputs())
    return n - failed, n


def measure(sessions: int, seed: int) -> dict:
    from tokenizers import Tokenizer

    model = B.bootstrap("test", 0, progress=False)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-implicit-"))
    results = []

    async def main():
        async with gateway_over_fakes(model, tmp / "gw", [0], log_events=True, abandon_after_s=0.5) as (client, fakes):
            fakes[0].script = ScriptedPolicy(tok, 0.5, seed)
            import anthropic

            url = str(client.make_url("")).rstrip("/")
            sdk = anthropic.AsyncAnthropic(base_url=url, api_key="key-u0", max_retries=0)
            loop = asyncio.get_running_loop()
            rng = random.Random(seed)
            heldout = T.tasks("heldout")

            async def create(**body):
                return (await sdk.messages.create(**body)).model_dump()

            chat = messages_transport(
                lambda **body: asyncio.run_coroutine_threadsafe(create(**body), loop).result(), 1.0, 256
            )
            for _ in range(sessions):
                session = functools.partial(run_session, chat, rng.choice(heldout), rng, _judge, user=UserModel())
                results.append(await loop.run_in_executor(None, session))
            await asyncio.sleep(1.5)  # the gateway's sweep names sessions abandoned for abandon_after_s
            await sdk.close()

    asyncio.run(main())
    spool = Spool(tmp / "gw" / "spool")
    segs = spool.segments()
    records, _, _ = spool.read((segs[0], 0), (segs[-1] + 1, 0), 10_000_000)
    named = [ev.decode(v) for t, _, v, _ in records if t == ev.TOPIC_FEEDBACK]
    named = [(f.signal, f.completion_id) for f in named if f.kind == ev.IMPLICIT]
    return score(results, named)


def score(results: list, named: list[tuple[str, str]]) -> dict:
    sessions = [SessionTruth(r.completion_ids, r.truth, r.writes, r.abandoned) for r in results]
    reactions = Counter(x for r in results for x in r.reactions + (["abandoned"] if r.abandoned else []))
    return {"sessions": len(results), "user_reactions": dict(reactions), **signal_quality.score(sessions, named)}


def main() -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    return measure(args.sessions, args.seed)


if __name__ == "__main__":
    print(json.dumps(main()))
