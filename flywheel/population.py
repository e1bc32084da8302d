"""A simulated population of IDE users with a hidden preference.

Each user asks for the body of a function it is writing (a held-out task: signature and docstring, the
code an IDE sends before the cursor), reads the completion and accepts it only if the function then
passes that task's hidden tests, run in the sandbox: a criterion the model is never told, judged by
running code, never by comparing with an answer string. Users also ignore some completions (no feedback
at all), and each types at its own pace. Beside them, agent users run short agent sessions
(flywheel.agent_session: read the file, write the body, run the tests) whose outcome, judged by the same
hidden tests, is feedback on the whole session. The official openai client talks to the gateway, one API
key per user, and every outcome is recorded with the weight version that served it.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass

from flywheel.core.events import parse_version
from online_rl import sandbox, tasks


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
    temperature: float = 1.0  # IDE sampling; greedy already passes these tasks, so users see samples
    max_tokens: int = 40
    ignore_rate: float = 0.1  # share of completions a user neither accepts nor rejects
    think_s: tuple[float, float] = (0.0, 0.4)  # pause between a user's requests
    split: str = "heldout"
    seed: int = 0


@dataclass
class Interaction:
    user: str
    task_id: str
    started: float  # time.time()
    latency_s: float
    version: int | None  # weight version that served the completion
    outcome: str  # accept | reject | ignore | failed
    error: str | None = None
    completion_id: str | None = None  # what the gateway issued (its events carry it)
    kind: str = "autocomplete"  # autocomplete | agent (one record per session: its first turn's version)
    session_id: str | None = None
    turns: int = 0
    tool_calls: int = 0
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
        self.tasks = tasks.tasks(cfg.split, cfg.seed)
        self.records: list[Interaction] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

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
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def snapshot(self) -> list[Interaction]:
        with self._lock:
            return list(self.records)

    def _feedback(self, key: str, completion_id: str | None, kind: str, session_id: str | None = None) -> None:
        about = {"session_id": session_id} if session_id else {"completion_id": completion_id}
        req = urllib.request.Request(
            f"{self.url}/v1/feedback",
            data=json.dumps({**about, "kind": kind}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).close()

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
                    max_tokens=self.cfg.max_tokens,
                    temperature=self.cfg.temperature,
                    user=f"user-{i}",
                )
                latency = time.monotonic() - t
                version = parse_version((r.model_extra or {}).get("model_version"))
                if rng.random() < ignore:
                    outcome = "ignore"
                else:
                    outcome = "accept" if self.prefers(task, r.choices[0].text) else "reject"
                    request_started = time.time()
                    self._feedback(key, r.id, outcome)
                rec = Interaction(f"user-{i}", task.task_id, started, latency, version, outcome, completion_id=r.id)
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
        import openai

        from flywheel.agent_session import chat_body, run_session, tests_passed

        rng = random.Random(f"{self.cfg.seed}/agent/{i}")
        key = self.keys[(self.cfg.users + i) % len(self.keys)]
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

        def chat(messages: list[dict]) -> dict:
            body = chat_body(messages, self.cfg.temperature, self.cfg.agent_max_tokens)
            return client.chat.completions.create(**body, user=f"agent-{i}").model_dump()

        def judge(task: tasks.Task, code: str) -> tuple[int, int]:  # run_tests in the agent's workspace
            if isinstance(self.prefers, HiddenTests):
                return tests_passed(task, code, self.prefers.cfg)
            return int(self.prefers(task, code.removeprefix(task.prompt))), 1  # a binary preference: 1 test

        while not self._stop.is_set():
            task = rng.choice(self.tasks)
            started, t = time.time(), time.monotonic()
            try:
                res = run_session(chat, task, rng, judge)
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
                )
            except Exception as e:  # a failed request is a result, not a crash of the population
                rec = Interaction(
                    f"agent-{i}",
                    task.task_id,
                    started,
                    time.monotonic() - t,
                    None,
                    "failed",
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


class HouseStyle:
    """A cheaper preference, judged by code in-process (for load tests, where a sandbox run per completion
    would load the machine under test): the function, once completed, parses and its body is a single
    `return` statement (the house style: one-expression helpers)."""

    def __call__(self, task: tasks.Task, completion: str) -> bool:
        import ast

        body = completion.split("\n\n", 1)[0]  # the function ends at its first blank line
        try:
            fn = ast.parse(task.prompt + body).body[0]
        except (SyntaxError, IndexError, ValueError):
            return False
        stmts = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return len(stmts) == 1 and isinstance(stmts[0], ast.Return)
