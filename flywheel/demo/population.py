"""A simulated population of IDE users with a hidden preference.

Each user asks for the body of a function it is writing (a held-out task: signature and docstring, the
code an IDE sends before the cursor), reads the completion and accepts it only if the function then
passes that task's hidden tests, run in the sandbox: a criterion the model is never told, judged by
running code, never by comparing with an answer string. Users also ignore some completions (no feedback
at all), and each types at its own pace. Beside them, agent users run short agent sessions
(flywheel.demo.agent_session: read the file, write the body, run the tests) whose outcome, judged by the same
hidden tests, is feedback on the whole session; with `mined_share`, that share of their sessions is on tasks mined
from real code (online_rl.tasks.mining), judged by the repository's own tests. The official openai client talks
to the gateway, one API key per user, and every outcome is recorded with the weight version that served it.

Besides accept and reject (`react`): a user glancing at a failing function accepts it now and then
(`fooled_rate`), and finds out later: with `feedback` persist or text, an accepted function is checked
`persist_after_s` later (`persisted`: a passing one is still in the file, a failing one was deleted), and
with text a user comments on a failing one (`comment_rate`) with a hint in the language the corpus taught
(online_rl.tasks.synthetic.hint_for: why it failed, as the function's author would say it), right after rejecting it
or when deleting it. Delayed signals are sent by a sender thread of their own at their time.
"""

from __future__ import annotations

import heapq
import json
import random
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Literal

from contracts.events import parse_version
from flywheel.demo.house_style import HouseStyle, parse_model_code  # noqa: F401 - where callers import them from
from online_rl.sandbox import judge as sandbox
from online_rl.tasks import synthetic as tasks


def _why(e: BaseException) -> str:
    """An exception and what caused it (the OpenAI client's "Connection error." hides whether the connection
    was refused, reset or closed without an answer)."""
    parts = [f"{type(e).__name__}: {e}"]
    if e.__cause__ is not None:
        parts.append(f"{type(e.__cause__).__name__}: {e.__cause__}")
    return " <- ".join(parts)[:300]


@dataclass
class PopulationConfig:
    users: int = 6  # autocomplete users
    agents: int = 0  # agent users (one session after another)
    agent_max_tokens: int = 96  # a write_file call carries the whole file
    # How agent users talk: the chat API with session feedback (a client written for Flywheel), or the
    # Messages API with none (as Claude Code does), their verdicts read by the gateway from what they do next
    # (flywheel.demo.agent_session.UserModel: corrections, repeats, undos, walking away).
    agent_api: Literal["chat", "messages"] = "chat"
    # Agent sessions on mined tasks (`flywheel tasks mine`, online_rl.tasks.mining.mixture): each session's task is
    # a mined one with probability mined_share (0: only synthetic tasks, drawn as they always were), drawn from the
    # tasks.jsonl files under mined_tasks (None: $FLYWHEEL_HOME/tasks, body and feature tasks both), judged by the
    # repository's own tests. Those tests run in the agent's code's own process, so a session can forge their reward
    # (as off-peak rollouts can: online_rl.config.RolloutConfig): a mined share is asked for by name.
    mined_share: float = 0.0
    mined_tasks: str | None = None
    mined_rewards_forgeable_ok: bool = False
    temperature: float = 1.0  # IDE sampling; greedy already passes these tasks, so users see samples
    max_tokens: int | None = None  # None: 40 for one-line bodies, 64 with multi-line ones (up to ~50 tokens)
    ignore_rate: float = 0.1  # share of completions a user neither accepts nor rejects
    think_s: tuple[float, float] = (0.0, 0.4)  # pause between a user's requests
    split: str = "heldout"
    families: str = "single"  # users' tasks: single (one-line bodies), multiline or all (the demo model knows both)
    seed: int = 0
    # Which signals users send besides accept/reject: basic (none), persist (+ persisted checks), text (+ comments)
    feedback: Literal["basic", "persist", "text"] = "basic"
    fooled_rate: float = 0.0  # share of failing completions a user accepts at a glance (and deletes later)
    comment_rate: float = 0.5  # share of failing completions a user comments on (text)
    persist_after_s: tuple[float, float] = (20.0, 40.0)  # when the persisted check follows an accept
    comment_after_s: float = 2.0  # a comment follows a reject this soon (a deleted one: with its check)

    def __post_init__(self):
        if not 0.0 <= self.mined_share <= 1.0:
            raise ValueError(f"the agents' mined share must be within [0, 1], got {self.mined_share}")
        if self.mined_share > 0 and not self.mined_rewards_forgeable_ok:
            raise ValueError(
                "agent sessions on mined tasks (--agent-mined-share) are judged by tests in the agent's code's own "
                "process, which it can game; say --mined-rewards-forgeable-ok to train on them anyway"
            )

    def completion_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else tasks.completion_tokens(self.families)


@dataclass
class Reaction:
    """What one user does about one completion: the judgment now, and the signals that follow it."""

    outcome: str  # accept | reject | ignore
    comment: str | None = None  # the user's words: a hint about why it failed
    comment_after_s: float = 0.0  # seconds after the judgment
    still_present: bool | None = None  # the persisted check of an accepted completion
    persist_after_s: float = 0.0


def react(
    rng: random.Random, cfg: PopulationConfig, task: tasks.Task, completion: str, passed: bool, ignore: float
) -> Reaction:
    """One user's reaction (the same random draws whatever `cfg.feedback`: runs that differ only in the
    signals sent see the same users)."""
    ignored, fooled, comments = rng.random() < ignore, rng.random() < cfg.fooled_rate, rng.random() < cfg.comment_rate
    persist_after = rng.uniform(*cfg.persist_after_s)
    if ignored:
        return Reaction("ignore")
    outcome = "accept" if passed or fooled else "reject"
    r = Reaction(outcome)
    if outcome == "accept" and cfg.feedback != "basic":
        r.still_present, r.persist_after_s = passed, persist_after
    if not passed and comments and cfg.feedback == "text":
        r.comment = tasks.hint_for(task, completion)
        r.comment_after_s = cfg.comment_after_s if outcome == "reject" else max(0.0, persist_after - 0.5)
    return r


@dataclass
class Interaction:
    user: str
    task_id: str
    started: float  # time.time()
    latency_s: float
    version: int | None  # weight version that served the completion
    outcome: str  # accept | reject | ignore | failed | judge_error (an agent session's tests could not run)
    error: str | None = None
    completion_id: str | None = None  # what the gateway issued (its events carry it)
    kind: str = "autocomplete"  # autocomplete | agent (one record per session: its first turn's version)
    passed: bool | None = None  # whether the completion passes the hidden tests (what a user keeps)
    comment: str | None = None  # the user's words about it, if any
    still_present: bool | None = None  # its persisted check, if one is sent
    session_id: str | None = None
    turns: int = 0
    tool_calls: int = 0
    # agent sessions: each turn's truth (its completion id -> the file it left passes), the user's reactions
    truth: dict | None = None
    reactions: list | None = None
    writes: list | None = None  # completion ids of the turns that wrote the file
    turn_versions: dict | None = None  # completion id -> the weight version that served it
    # A failure's own request (an interaction is a completion, then its feedback): when it began.
    failed_request_started: float | None = None


class HiddenTests:
    """The preference: the completed function passes the task's hidden tests in the sandbox."""

    def __init__(self, cfg: sandbox.SandboxConfig | None = None):
        self.cfg = cfg or sandbox.SandboxConfig()

    def __call__(self, task: tasks.Task, completion: str) -> bool:
        return sandbox.run([sandbox.candidate_for(task, completion)], self.cfg)[0].ok


class Population:
    def __init__(self, cfg: PopulationConfig, gateway_url: str, keys: list[str], preference=None):
        if not keys:
            raise ValueError("the population needs at least one API key")
        self.cfg = cfg
        self.url = gateway_url
        self.keys = keys
        self.prefers = preference or HiddenTests()
        self.tasks = tasks.tasks(cfg.split, cfg.seed, families=cfg.families)
        # Each agent's mixture, made here: a missing or empty mined tasks path is an error now, not in the agents'
        # threads, where it would end them unseen and leave a run with no agent sessions.
        self._mixtures = self._agent_mixtures()
        self.records: list[Interaction] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._later: list[tuple[float, int, str, dict]] = []  # (due monotonic, seq, key, body): delayed signals
        self._later_cv = threading.Condition(self._lock)
        self._later_seq = 0
        self.signals_sent = {"comment": 0, "persisted": 0}
        self.signals_dropped = 0  # delayed signals still due when the population stopped

    def _agent_mixtures(self) -> list:
        if self.cfg.agents <= 0 or self.cfg.mined_share <= 0:
            return [None] * self.cfg.agents
        from flywheel.demo.agent_session import agent_mixture

        return [agent_mixture(self.cfg, self.tasks, i) for i in range(self.cfg.agents)]

    def start(self) -> "Population":
        # The openai package imports its resources lazily, on a client's first use: users starting together
        # would import them from several threads at once, which importlib can refuse (a _DeadlockError on
        # openai.resources.chat was one user's "failed request" in a demo run). Imported here, once.
        import openai.resources.chat  # noqa: F401
        import openai.resources.completions  # noqa: F401

        self._threads = [
            threading.Thread(target=self._user, args=(i,), name=f"user-{i}", daemon=True) for i in range(self.cfg.users)
        ]
        self._threads += [
            threading.Thread(target=self._agent, args=(i,), name=f"agent-{i}", daemon=True)
            for i in range(self.cfg.agents)
        ]
        self._threads.append(threading.Thread(target=self._sender, name="delayed-signals", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._later_cv.notify_all()
        for t in self._threads:
            t.join(timeout=120)
        with self._lock:
            self.signals_dropped += len(self._later)
            self._later.clear()

    def _send_later(self, delay_s: float, key: str, body: dict) -> None:
        with self._lock:
            self._later_seq += 1
            heapq.heappush(self._later, (time.monotonic() + delay_s, self._later_seq, key, body))
            self._later_cv.notify_all()

    def _sender(self) -> None:
        """Sends each delayed signal at its time; one that fails is dropped (the user moved on), as a lost
        signal is in the field: the trainer trains the sample on what it has when its window ends."""
        while not self._stop.is_set():
            with self._lock:
                while not self._stop.is_set() and (not self._later or self._later[0][0] > time.monotonic()):
                    self._later_cv.wait(timeout=None if not self._later else self._later[0][0] - time.monotonic())
                if self._stop.is_set():
                    return
                _, _, key, body = heapq.heappop(self._later)
            try:
                self._post(key, body)
                with self._lock:
                    self.signals_sent[body["kind"]] += 1
            except Exception:
                with self._lock:
                    self.signals_dropped += 1

    def snapshot(self) -> list[Interaction]:
        with self._lock:
            return list(self.records)

    def _feedback(self, key: str, completion_id: str | None, kind: str, session_id: str | None = None) -> None:
        about = {"session_id": session_id} if session_id else {"completion_id": completion_id}
        self._post(key, {**about, "kind": kind})

    def _post(self, key: str, body: dict) -> None:
        req = urllib.request.Request(
            f"{self.url}/v1/feedback",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).close()

    def _signals(self, key: str, completion_id: str, r: Reaction) -> None:
        """The delayed signals of a reaction, in their order (a deleted function's comment before its check)."""
        if r.comment is not None:
            self._send_later(
                r.comment_after_s, key, {"completion_id": completion_id, "kind": "comment", "text": r.comment}
            )
        if r.still_present is not None:
            body = {"completion_id": completion_id, "kind": "persisted", "still_present": r.still_present}
            self._send_later(r.persist_after_s, key, {**body, "after_s": round(r.persist_after_s, 3)})

    def _user(self, i: int) -> None:
        import openai

        rng = random.Random(f"{self.cfg.seed}/{i}")
        key = self.keys[i % len(self.keys)]
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)
        ignore = min(0.9, max(0.0, rng.gauss(self.cfg.ignore_rate, self.cfg.ignore_rate / 2)))
        while not self._stop.is_set():
            task = rng.choice(self.tasks)
            started, t = time.time(), time.monotonic()
            request_started = started
            try:
                r = client.completions.create(
                    model="flywheel-coder",
                    prompt=task.prompt,
                    max_tokens=self.cfg.completion_tokens(),
                    temperature=self.cfg.temperature,
                    user=f"user-{i}",
                )
                latency = time.monotonic() - t
                version = parse_version((r.model_extra or {}).get("model_version"))
                text = r.choices[0].text
                passed = self.prefers(task, text)
                reaction = react(rng, self.cfg, task, text, passed, ignore)
                if reaction.outcome != "ignore":
                    request_started = time.time()
                    self._feedback(key, r.id, reaction.outcome)
                    self._signals(key, r.id, reaction)
                rec = Interaction(
                    f"user-{i}",
                    task.task_id,
                    started,
                    latency,
                    version,
                    reaction.outcome,
                    completion_id=r.id,
                    passed=passed,
                    comment=reaction.comment,
                    still_present=reaction.still_present,
                )
            except Exception as e:  # a failed request is a result, not a crash of the population
                rec = Interaction(
                    f"user-{i}",
                    task.task_id,
                    started,
                    time.monotonic() - t,
                    None,
                    "failed",
                    _why(e),
                    failed_request_started=request_started,
                )
            with self._lock:
                self.records.append(rec)
            self._stop.wait(rng.uniform(*self.cfg.think_s))

    def _agent(self, i: int) -> None:
        from flywheel.demo.agent_session import (
            JudgeError,
            UserModel,
            chat_body,
            messages_transport,
            run_session,
            tests_passed,
        )

        rng = random.Random(f"{self.cfg.seed}/agent/{i}")
        key = self.keys[(self.cfg.users + i) % len(self.keys)]
        user = None
        if self.cfg.agent_api == "messages":  # as Claude Code: the Messages API, no feedback, a user who reacts
            import anthropic

            messages_client = anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0, timeout=120)
            chat = messages_transport(
                lambda **body: messages_client.messages.create(**body).model_dump(),
                self.cfg.temperature,
                self.cfg.agent_max_tokens,
            )
            user = UserModel()
        else:
            import openai

            client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

            def chat(messages: list[dict]) -> dict:
                body = chat_body(messages, self.cfg.temperature, self.cfg.agent_max_tokens)
                return client.chat.completions.create(**body, user=f"agent-{i}").model_dump()

        def judge(task, code) -> tuple[int, int]:  # run_tests in the agent's workspace
            if isinstance(self.prefers, HiddenTests) or not isinstance(task, tasks.Task):  # a mined task: its tests
                return tests_passed(task, code, getattr(self.prefers, "cfg", None))
            return int(self.prefers(task, code.removeprefix(task.prompt))), 1  # a binary preference: 1 test

        mixture = self._mixtures[i]
        while not self._stop.is_set():
            task = rng.choice(self.tasks) if mixture is None else mixture.draw(1)[0]
            started, t = time.time(), time.monotonic()
            try:
                res = run_session(chat, task, rng, judge, user=user)
                if user is None:  # a client written for Flywheel says how the session went
                    self._feedback(key, None, res.outcome, session_id=res.session_id)
                rec = Interaction(
                    f"agent-{i}",
                    task.task_id,
                    started,
                    time.monotonic() - t,
                    res.versions[0],
                    res.outcome,
                    completion_id=res.completion_ids[0],
                    kind="agent",
                    session_id=res.session_id,
                    turns=res.turns,
                    tool_calls=res.calls,
                    truth=res.truth,
                    reactions=res.reactions + (["abandoned"] if res.abandoned else []),
                    writes=res.writes,
                    turn_versions=dict(zip(res.completion_ids, res.versions)),
                )
            except Exception as e:  # a failed request is a result, not a crash of the population
                rec = Interaction(
                    f"agent-{i}",
                    task.task_id,
                    started,
                    time.monotonic() - t,
                    None,
                    "judge_error" if isinstance(e, JudgeError) else "failed",
                    _why(e),
                    kind="agent",
                )
            with self._lock:
                self.records.append(rec)
            self._stop.wait(rng.uniform(*self.cfg.think_s))

    def write(self, path) -> None:
        with open(path, "w") as f:
            for r in self.snapshot():
                f.write(json.dumps(asdict(r)) + "\n")
