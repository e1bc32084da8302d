"""Cache-aware routing on two real SGLang replicas: a user typing stays where its prefix is cached, and the
replica's cached_tokens reach the client (usage), the completion event and /metrics. The short version of
`python -m benchmarks.routing` (IDE traffic through both policies) runs here too."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request

import openai
import pytest

from contracts import events as ev, replica_keys
from loadtests import ide_prefix as ide
from serving import gateway_process
from tests.helpers import GATEWAY_ADMIN, GATEWAY_KEYS, get
from tests.integration.serving.test_gateway import _read_events

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def two_gateways(replica, second_replica, test_model, kafka_bootstrap, tmp_path):
    gws = {}
    try:
        for policy in ("cache_aware", "least_outstanding"):
            gws[policy] = gateway_process.start(
                [replica.url, second_replica.url],
                test_model,
                tmp_path / policy,
                kafka=kafka_bootstrap,
                keys=GATEWAY_KEYS,
                admin_token=GATEWAY_ADMIN,
                extra_args=["--routing", policy],
            )
        yield gws
    finally:
        for gw in gws.values():
            assert gw.stop(), f"gateway pid {gw.pid} did not stop"


def _flush(*replicas) -> None:
    for r in replicas:
        req = urllib.request.Request(f"{r.url}/flush_cache", method="POST", headers=replica_keys.admin_headers())
        with urllib.request.urlopen(req, timeout=30):
            pass


def _typing(client, file: str, steps: int) -> list:
    """A user typing on at the end of a file: each prompt extends the last by a line."""
    out = []
    for i in range(steps):
        file += f"    total_{i} = count_{i} + {i}\n"
        out.append(client.completions.create(model="m", prompt=file, max_tokens=2, temperature=0.0))
    return out


def test_a_typing_user_stays_on_its_cache_and_cached_tokens_are_reported(
    two_gateways, replica, second_replica, kafka_bootstrap
):
    _flush(replica, second_replica)
    file = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(12))
    alice = openai.OpenAI(base_url=f"{two_gateways['cache_aware'].url}/v1", api_key="key-alice", max_retries=0)
    answers = _typing(alice, file, 5)
    cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers]
    assert cached[0] == 0 and all(c >= 64 for c in cached[1:]), cached  # SGLang held the earlier prompt
    events = _read_events(kafka_bootstrap, ev.TOPIC_COMPLETIONS, {a.id for a in answers}, want=1)
    by_id = {cid: found[0][2] for cid, found in events.items()}
    assert len({e.replica for e in by_id.values()}) == 1  # all five on one replica
    assert [by_id[a.id].cached_tokens for a in answers] == cached

    status, page = get(f"{two_gateways['cache_aware'].url}/metrics")
    assert status == 200
    home = next(iter(by_id.values())).replica
    hit = [
        ln
        for ln in page.splitlines()
        if ln.startswith("flywheel_gateway_prefix_hit_rate{") and f'replica="{home}"' in ln and "cache_aware" in ln
    ]
    assert hit and 0.4 < float(hit[0].rsplit(" ", 1)[1]) < 1.0, hit
    assert 'flywheel_gateway_routing_decisions_total{policy="cache_aware",why="match"} 4.0' in page

    # Least outstanding scatters the same typing over both replicas, and each miss is paid again.
    _flush(replica, second_replica)
    bob = openai.OpenAI(base_url=f"{two_gateways['least_outstanding'].url}/v1", api_key="key-bob", max_retries=0)
    answers = _typing(bob, file.replace("f_", "g_"), 5)
    events = _read_events(kafka_bootstrap, ev.TOPIC_COMPLETIONS, {a.id for a in answers}, want=1)
    assert {found[0][2].replica for found in events.values()} == {"r0", "r1"}
    assert answers[1].usage.prompt_tokens_details.cached_tokens < cached[1]  # its replica had not seen it


def test_ide_traffic_through_both_policies(two_gateways, replica, second_replica, test_model):
    """The benchmark's workload, small: files that fit the test model's 512 positions, a few users."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
    sample = ide.synthetic_file(random.Random(1), 4000)
    cfg = ide.IdeWorkloadConfig(
        users=3,
        file_tokens=(120, 200),
        move_chance=0.0,  # typing only: every prompt stays within the test model's 384
        chars_per_token=len(sample) / len(tok.encode(sample).ids),
        suffix_chars=40,
        think_s=0.1,
        max_tokens=2,
        switch_every=3,
        switching_share=0.5,
    )
    rates = {}
    for policy, gw in two_gateways.items():
        _flush(replica, second_replica)
        t = ide.Target(gw.url, "gateway", "key-alice")
        summary = ide.summarize(t, asyncio.run(ide.run(t, cfg, requests=6, warmup=1)))
        assert summary["errors"] == 0 and summary["requests"] == 18, (policy, t.errors[:3], summary)
        assert summary["ttft_p50_ms"] > 0 and summary["requests_per_s"] > 0
        rates[policy] = summary["hit_rate"]
    # Each prompt extends one its replica already holds; least outstanding lands on the other replica about
    # half the time, where only an older prompt of the file is.
    assert rates["cache_aware"] > max(0.5, rates["least_outstanding"]), rates
    status, text = get(f"{two_gateways['cache_aware'].url}/admin/replicas", key=GATEWAY_ADMIN)
    body = json.loads(text)
    assert status == 200 and body["routing"]["policy"] == "cache_aware"
    assert body["routing"]["decisions"].get("match", 0) > 0


# Serial: cProfile's clock is wall time, and the baseline's idle wait against the measured run's work came out
# negative in total beside another worker (-13.6 ms a request, make test on a6d13d2).
@pytest.mark.serial
def test_the_gateway_profile_says_where_a_request_goes(replica, test_model, tmp_path):
    """The benchmark's profile of our added latency, small: per-request time by module family, the first
    requests' one-time work (lazy imports) subtracted by a gateway that served a tenth as many."""
    from benchmarks._gateway_profile import profile_gateway
    from benchmarks.routing import KEY, added_latency, stop_ids

    stops = stop_ids(test_model)
    served: list[int] = []

    def load(url: str, n: int) -> None:
        served.append(n)
        asyncio.run(added_latency(replica.url, url, None, n, stops))

    out = profile_gateway(
        ["--model", str(test_model), "--no-events", "--replica", replica.url],
        KEY,
        tmp_path / "profiled",
        60,
        load,
    )
    assert served == [60, 6]  # the measured gateway, then the baseline with a tenth as many
    assert out["profiled_us_per_request"] > 0, out
    assert out["by_family_us"].get("aiohttp", 0) > 0, out  # a request is HTTP in and out, whatever else
    assert len(out["top_functions_us"]) == 15
    # Start-up imports (about a second of loading modules: 15+ ms a request if counted) are the baseline's
    # too; what is left of them is noise.
    imports = [us for site, us in out["top_functions_us"] if "marshal" in site or "<module>" in site]
    assert all(us < 2000 for us in imports), out
