"""Tenants never see each other through a real SGLang replica's prefix cache (serving.tenants.cache_scope): bob sends
the prompt alice sent and gets no cached token and no faster first token, while alice's own repeat is a hit
and bob shares his own prefixes. The routing half (the cache-aware index) is in
tests/unit/serving/tenants/test_cache_isolation.py; the two-replica routing tests in test_cache_routing.py."""

from __future__ import annotations

import random
import statistics
import time

import openai
import pytest

pytestmark = pytest.mark.timeout(600)
CHARS = 8000  # ~6.5k tokens of the test model's tokenizer
HIT = 4000  # cached tokens of a prompt that is a hit (its prefix sent before in the same scope)
# What a tenant's own earlier files share with any file of this test (the leading "# " of the nonce line): its
# own cache, in its own scope. Alice's file would give bob thousands.
OWN = 8


def _secret_file(seed: int) -> str:
    """A file of about CHARS characters that no one has sent before (a nonce first: no earlier test shares it)."""
    rng = random.Random(seed)
    lines = [f"# {rng.getrandbits(64):016x} {time.time_ns()}\n"]
    while sum(map(len, lines)) < CHARS:
        lines.append(f"api_key_{rng.randrange(10**6)} = {rng.randrange(10**9)} * secret_{rng.randrange(10**6)}\n")
    return "".join(lines)


def _ask(client: openai.OpenAI, prompt: str) -> tuple[float, int]:
    """(seconds to the first streamed chunk, cached prompt tokens) of one completion."""
    t0 = time.monotonic()
    stream = client.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=2,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    ttft, cached = None, None
    for chunk in stream:
        if ttft is None:
            ttft = time.monotonic() - t0
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    assert ttft is not None and cached is not None
    return ttft, cached


def test_another_tenants_prompt_is_neither_cached_nor_faster(gateway):
    alice = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-alice", max_retries=0)
    bob = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-bob", max_retries=0)
    ttft: dict[str, list[float]] = {"alice_hit": [], "bob_on_alices": [], "bob_fresh": []}
    for round_ in range(5):
        secret = _secret_file(2 * round_)
        _, cached = _ask(alice, secret)
        assert cached <= OWN, cached  # nobody sent it before
        t, cached = _ask(alice, secret + "x")
        assert cached >= HIT, cached  # alice reuses her own prefix
        ttft["alice_hit"].append(t)

        # Bob guesses alice's file (here he knows it all): the replica has it cached, in alice's scope only.
        t, cached = _ask(bob, secret + "y")
        assert cached <= OWN, f"bob was served {cached} tokens of alice's prompt from the cache"
        ttft["bob_on_alices"].append(t)
        t, cached = _ask(bob, _secret_file(2 * round_ + 1))  # what a miss costs bob on a file nobody sent
        assert cached <= OWN
        ttft["bob_fresh"].append(t)

        _, cached = _ask(bob, secret + "z")
        assert cached >= HIT, cached  # bob shares his own prefixes
        _, cached = _ask(alice, secret + "w")
        assert cached >= HIT, cached  # and alice's cache is still hers
    med = {k: statistics.median(v) for k, v in ttft.items()}
    print("TTFT medians (s):", {k: round(v, 3) for k, v in med.items()}, "all:", ttft)
    # Bob on alice's file is a miss like any other, not a hit. A hit saves less here than on a GPU (the CPU
    # replicas' torch_native attention recomputes attention over the cached prefix): measured medians 0.29 s
    # for alice's hit, 0.46 s for bob on her file, 0.53 s for his fresh file (13k tokens: 3.0, 4.9, 4.5 s).
    assert med["bob_on_alices"] > 1.3 * med["alice_hit"], med
    assert med["bob_on_alices"] > 0.6 * med["bob_fresh"], med
