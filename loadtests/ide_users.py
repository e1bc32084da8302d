"""Locust users shaped like IDE clients, and the pass/fail rules every scenario shares.

    AutocompleteUser  fill-in-the-middle on /v1/completions (code before and after the cursor), mostly
                      non-streaming, short max_tokens, then accept/reject feedback after each completion
    ChatUser          streamed /v1/chat/completions; time to first token is its own locust entry ("TTFT")
    AgentUser         one at a time (fixed_count): short agent sessions with tools (flywheel.demo.agent_session:
                      read the file, write it, run its tests), then feedback on the whole session
Each simulated user gets its own API key (round-robin over FLYWHEEL_LOADTEST_KEYS). Feedback follows a
hidden preference judged by code in-process (flywheel.demo.population.HouseStyle: cheap enough not to load
the machine under test).

Pass/fail (the quitting listener sets locust's exit code): zero failed requests, and the p99 of completion
latency after the scenario's first action within FLYWHEEL_LOADTEST_P99_MULTIPLE (default 2.0) of the
p99 before it (agent turns aside: a different latency class, up to a whole file per answer), measured
side by side in the same run (the steady scenario compares the second part of
its run with the first). Results: <out>/result.json, per-request latencies in <out>/requests.csv, the
scenario's action moments in <out>/marks.json, issued completion ids in <out>/issued.jsonl.
"""

from __future__ import annotations

import csv
import itertools
import json
import random
import time
from pathlib import Path

import numpy as np
from locust import FastHttpUser, between, events, task

from contracts.events import parse_version
from flywheel.demo.population import HouseStyle
from infra.config import env
from online_rl.tasks import synthetic as tasks

OUT = Path(env("FLYWHEEL_LOADTEST_OUT") or "loadtest_out")
P99_MULTIPLE = float(env("FLYWHEEL_LOADTEST_P99_MULTIPLE") or "2.0")
P99_FLOOR_MS = float(env("FLYWHEEL_LOADTEST_P99_FLOOR_MS") or "50")  # below this, p99 is noise
KEYS = [k for k in (env("FLYWHEEL_LOADTEST_KEYS") or "").split(",") if k]
TASKS = tasks.tasks("heldout")
SUFFIX = "\n\n\ndef main():\n    print({name}({arg}))\n"  # code after the cursor: a caller of the function

_key_cycle = itertools.cycle(range(max(1, len(KEYS))))
_prefers = HouseStyle()
requests_log: list[tuple[float, str, float, bool, int | None]] = []  # (start time.time(), name, ms, ok, version)
issued: list[dict] = []  # completion ids and the feedback sent for each
marks: list[dict] = []  # the scenario's actions: {"at": time.time(), "what": ...}
errors: list[str] = []  # the scenario's actions that failed (each fails the run)
bad_versions: set[int] = set()  # versions meant to be bad (rollback): their slowness is not the switch's


def mark(what: str, **extra) -> None:
    marks.append({"at": time.time(), "what": what, **extra})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "marks.json").write_text(json.dumps(marks, indent=1))


class IdeUser(FastHttpUser):
    abstract = True
    wait_time = between(0.2, 1.0)
    network_timeout = 120.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        if not KEYS:
            raise RuntimeError("set FLYWHEEL_LOADTEST_KEYS to the gateway API keys (comma-separated)")
        self.key = KEYS[next(_key_cycle) % len(KEYS)]
        self.headers = {"Authorization": f"Bearer {self.key}"}
        self.rng = random.Random()

    def _feedback(self, completion_id: str, text: str, task_: tasks.Task) -> None:
        kind = "accept" if _prefers(task_, text) else "reject"
        with self.client.post(
            "/v1/feedback",
            json={"completion_id": completion_id, "kind": kind},
            headers=self.headers,
            name="/v1/feedback",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"feedback {r.status_code}: {r.text[:200]}")
        issued.append({"id": completion_id, "feedback": kind})


class AutocompleteUser(IdeUser):
    weight = 4

    @task
    def complete(self) -> None:
        t = self.rng.choice(TASKS)
        stream = self.rng.random() < 0.2
        body = {
            "model": "flywheel-coder",
            "prompt": t.prompt,
            "suffix": SUFFIX.format(name=t.name, arg="1"),
            "max_tokens": 24,
            "temperature": 0.2,
            "stream": stream,
        }
        name = "/v1/completions [fim, stream]" if stream else "/v1/completions [fim]"
        started, t0 = time.time(), time.perf_counter()
        with self.client.post(
            "/v1/completions", json=body, headers=self.headers, name=name, stream=stream, catch_response=True
        ) as r:
            cid, text, ok, version = _read(r, stream, t0, self.environment, "TTFT /v1/completions")
            requests_log.append((started, name, r.request_meta["response_time"], ok, version))
        if ok and cid is not None:
            self._feedback(cid, text, t)


class ChatUser(IdeUser):
    weight = 1

    @task
    def chat(self) -> None:
        t = self.rng.choice(TASKS)
        body = {
            "model": "flywheel-coder",
            "stream": True,
            "max_tokens": 40,
            "temperature": 0.7,
            "messages": [{"role": "user", "content": f"Write the body of this function:\n{t.prompt}"}],
        }
        started, t0 = time.time(), time.perf_counter()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=self.headers,
            name="/v1/chat/completions",
            stream=True,
            catch_response=True,
        ) as r:
            cid, text, ok, version = _read(r, True, t0, self.environment, "TTFT /v1/chat/completions")
            requests_log.append((started, "/v1/chat/completions", r.request_meta["response_time"], ok, version))
        if ok and cid is not None:
            self._feedback(cid, text, t)


class AgentUser(IdeUser):
    fixed_count = 1  # exactly one, whatever the user count: its sessions are long and its turns heavy

    @task
    def session(self) -> None:
        from flywheel.demo.agent_session import chat_body, run_session

        t = self.rng.choice(TASKS)

        def chat(messages: list[dict]) -> dict:
            started, t0 = time.time(), time.perf_counter()
            with self.client.post(
                "/v1/chat/completions",
                json=chat_body(messages, 0.7, 96),
                headers=self.headers,
                name="/v1/chat/completions [agent]",
                catch_response=True,
            ) as r:
                ok = r.status_code == 200
                if not ok:
                    r.failure(f"{r.status_code}: {(r.text or '')[:200]}")
                doc = r.json() if ok else {}
                requests_log.append(
                    (
                        started,
                        "/v1/chat/completions [agent]",
                        (time.perf_counter() - t0) * 1000,
                        ok,
                        parse_version(doc.get("model_version")),
                    )
                )
            if not ok:
                raise RuntimeError(f"agent turn failed: {r.status_code}")
            return doc

        try:
            res = run_session(
                chat, t, self.rng, judge=lambda task, code: (int(_prefers(task, code.removeprefix(task.prompt))), 1)
            )
        except RuntimeError:
            return  # the failed turn is counted by locust already
        with self.client.post(
            "/v1/feedback",
            json={"session_id": res.session_id, "kind": res.outcome},
            headers=self.headers,
            name="/v1/feedback [session]",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(f"session feedback {r.status_code}: {r.text[:200]}")
        issued.append({"session": res.session_id, "ids": res.completion_ids, "feedback": res.outcome})


def _read(r, stream: bool, t0: float, env, ttft_name: str) -> tuple[str | None, str, bool, int | None]:
    """Consume a (streamed) completion; records TTFT; marks the request failed on any error. Returns the
    completion id, its text, whether it succeeded, and the weight version that served it."""
    if r.status_code != 200:
        r.failure(f"{r.status_code}: {(r.text or '')[:200]}")
        return None, "", False, None
    if not stream:
        doc = r.json()
        return doc["id"], doc["choices"][0].get("text", ""), True, parse_version(doc.get("model_version"))
    cid: str | None = None
    version: int | None = None
    parts, first, done, buf = [], None, False, ""
    try:
        for chunk in r.iter_content(chunk_size=4096):
            buf += chunk if isinstance(chunk, str) else chunk.decode()
            while "\n\n" in buf:
                event, buf = buf.split("\n\n", 1)
                if not event.startswith("data: "):
                    continue
                data = event[6:]
                if data == "[DONE]":
                    done = True
                    continue
                doc = json.loads(data)
                if "error" in doc:
                    raise RuntimeError(doc["error"].get("message"))
                cid = doc.get("id", cid)
                version = parse_version(doc.get("model_version")) if doc.get("model_version") is not None else version
                for c in doc.get("choices", []):
                    piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                    if piece and first is None:
                        first = (time.perf_counter() - t0) * 1000
                        env.events.request.fire(
                            request_type="TTFT",
                            name=ttft_name,
                            response_time=first,
                            response_length=0,
                            exception=None,
                            context={},
                        )
                    parts.append(piece)
    except Exception as e:
        r.failure(f"stream broke: {e}")
        return cid, "", False, version
    r.request_meta["response_time"] = (time.perf_counter() - t0) * 1000  # the whole stream, not the headers
    if not done:
        r.failure("stream ended without [DONE]")
        return cid, "", False, version
    return cid, "".join(parts), True, version


# ---------------------------------------------------------------------------------- pass / fail
def judge(environment) -> dict:
    """The thresholds, on this run's own requests; returns the result written to result.json."""
    completions = [
        (s, ms)
        for s, name, ms, ok, version in requests_log
        if ok and version not in bad_versions and not name.endswith("[agent]")
    ]
    split = marks[0]["at"] if marks else None
    if split is None and completions:  # steady: the second part of the run against the first
        starts = sorted(s for s, _ in completions)
        split = starts[int(0.4 * len(starts))]
    before = np.array([ms for s, ms in completions if split is not None and s < split])
    after = np.array([ms for s, ms in completions if split is not None and s >= split])
    p99_before = float(np.percentile(before, 99)) if before.size else None
    p99_after = float(np.percentile(after, 99)) if after.size else None
    total = environment.stats.total
    reasons = list(errors)
    if total.num_failures:
        reasons.append(f"{total.num_failures} failed requests")
    if total.num_requests == 0:
        reasons.append("no requests were made")
    if p99_before is None or p99_after is None:
        reasons.append("too few completions to compare p99 before and after")
    elif p99_after > P99_MULTIPLE * max(p99_before, P99_FLOOR_MS):
        reasons.append(f"p99 {p99_after:.0f} ms after the first action > {P99_MULTIPLE}x {p99_before:.0f} ms before")
    return {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "completions_before": int(before.size),
        "completions_after": int(after.size),
        "p99_before_ms": p99_before and round(p99_before, 1),
        "p99_after_ms": p99_after and round(p99_after, 1),
        "p99_ratio": round(p99_after / p99_before, 3) if p99_before and p99_after else None,
        "p99_multiple_allowed": P99_MULTIPLE,
        "excluded_bad_versions": sorted(bad_versions),
        "marks": marks,
        "passed": not reasons,
        "reasons": reasons,
    }


@events.quitting.add_listener
def _quitting(environment, **_kw) -> None:
    result = judge(environment)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(result, indent=1))
    with open(OUT / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start", "name", "ms", "ok", "version"])
        w.writerows([f"{s:.3f}", n, f"{ms:.1f}", int(ok), v] for s, n, ms, ok, v in requests_log)
    with open(OUT / "issued.jsonl", "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in issued)
    verdict = "PASS" if result["passed"] else "FAIL: " + "; ".join(result["reasons"])
    print(
        f"loadtest {verdict} (p99 before {result['p99_before_ms']} ms, after {result['p99_after_ms']} ms, "
        f"{result['failures']}/{result['requests']} failed)",
        flush=True,
    )
    environment.process_exit_code = 0 if result["passed"] else 1
