"""Prompts as long as agent clients send: time to first token at 2k, 8k and 32k tokens on these CPUs, cold and
with the prefix cached, and whether answers stay well-formed after that much system prompt.

A client-style agent turn (online_rl.tasks.agent_clients: a shell tool among others, the request, the file's
content) after a system prompt of N tokens, on one SGLang replica of the demo model (the test model's with
--preset test), through /generate streamed:
  cold     a system prompt the replica has never seen (a fresh nonce first)
  cached   the same system prompt again with another request after it: what a client's next turn costs (it
           resends the same system prompt every turn), the radix cache holding the prefix
  valid    of `samples` answers at temperature 1 (and the greedy one) after that system prompt, the share that
           is a well-formed call to one of the turn's tools (serving's rules, online_rl.tasks.agent_episodes); and
           each answer's outcome (valid, malformed, unknown_tool: well-formed, naming a tool not offered, none)
Prints one JSON object as its last line; plots TTFT by length (benchmarks/results/long_context.png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

import aiohttp
from tokenizers import Tokenizer

from online_rl.model import bootstrap as B
from online_rl.tasks import agent_clients as C, agent_episodes as A, synthetic as T
from serving.replica.process import ReplicaConfig, start as start_replica

LENGTHS = (2048, 8192, 32768)
HERE = Path(__file__).resolve().parent


def turn_prompt(
    tok: Tokenizer, task: T.Task, tokens: int, seed: int, nonce: str, path: str = "app.py", ask: int = 0, context=None
) -> tuple[list[int], tuple, C.Context]:
    """A client-style first turn (read the file) whose whole prompt is about `tokens` tokens, nearly all of
    it the system prompt; with `context`, that system prompt as it is (a client's next request: same system
    prompt and tools, another request after them)."""
    chars = 2 * tokens
    for _ in range(8):  # the prose's tokens per character vary: scale it until the prompt is within 2%
        rng = random.Random(seed)
        shell = C.client_shell(rng)
        ctx = context or C.Context(system=(f"{nonce}\n" + C.prose(rng, chars),))
        _, turns = A.episode(task, task.reference, path, A.SHELL_ASKS[ask], shell, ctx, rng)
        ids = tok.encode(turns[0].prompt).ids
        if context is not None or abs(len(ids) - tokens) <= 0.02 * tokens:
            break
        chars = int(chars * tokens / len(ids))
    return ids, shell.tools, ctx


async def _ttft(session: aiohttp.ClientSession, url: str, ids: list[int], max_new: int, temperature: float):
    """(seconds to the first streamed chunk, the whole answer's text) of one /generate."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new, "temperature": temperature},
        "stream": True,
    }
    t0, first, text = time.monotonic(), None, ""
    async with session.post(f"{url}/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            first = first if first is not None else time.monotonic() - t0
            text = json.loads(line[6:])["text"]
    return first, text


async def measure(url: str, tok: Tokenizer, lengths, samples: int) -> dict:
    first, second = T.tasks("heldout")[:2]
    out = {}
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        for n in lengths:
            nonce = f"run {time.time_ns()}"  # a system prompt this replica has never seen
            ids, tools, context = turn_prompt(tok, first, n, seed=n, nonce=nonce)
            cold, greedy = await _ttft(s, url, ids, 96, 0.0)
            # the same system prompt and tools, another request after them (the client's next task): the
            # prefix is cached, the request is new
            again, _, _ = turn_prompt(tok, second, n, seed=n, nonce=nonce, path="lib.py", ask=2, context=context)
            shared = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
            cached, _ = await _ttft(s, url, again, 1, 0.0)
            answers = [greedy] + [(await _ttft(s, url, ids, 96, 1.0))[1] for _ in range(samples)]
            outcomes = [A.call_outcome(a, tools) for a in answers]
            valid = [o == "valid" for o in outcomes]
            out[str(n)] = {
                "prompt_tokens": len(ids),
                "ttft_cold_s": round(cold, 3),
                "ttft_cached_s": round(cached, 3),
                "cached_prompt_tokens": len(again),
                "shared_prefix_tokens": shared,
                "valid_greedy": valid[0],
                "valid_t1": round(sum(valid[1:]) / max(1, samples), 3),
                # unknown_tool: a well-formed call naming a tool the turn does not offer (another client's shell)
                "outcomes_t1": dict(sorted(Counter(outcomes[1:]).items())),
                "example": answers[0][:120],
            }
            print(json.dumps({n: out[str(n)]}), flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(k) for k in result]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, [result[str(x)]["ttft_cold_s"] for x in xs], "o-", label="cold")
    ax.plot(xs, [result[str(x)]["ttft_cached_s"] for x in xs], "o-", label="prefix cached")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("system prompt (tokens)")
    ax.set_ylabel("time to first token (s)")
    ax.set_title("long prompts on 2 CPU cores (SGLang, one replica)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    args = ap.parse_args()
    model = B.bootstrap(args.preset, 0, progress=False)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    replica = start_replica(ReplicaConfig(model_path=model, threads=2, max_total_tokens=65536))
    try:
        result = asyncio.run(measure(replica.url, tok, [int(x) for x in args.lengths.split(",")], args.samples))
    finally:
        replica.stop()
    plot(result, HERE / "results" / "long_context.png")
    return {"preset": args.preset, "model": model.name, "lengths": result}


if __name__ == "__main__":
    print(json.dumps(main()))
