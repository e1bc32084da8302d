"""Trainer vs served numerics on a real replica, and sandbox rollouts through the gateway's admin path."""

import json
import subprocess
import sys

import numpy as np
import pytest

from contracts import replica_keys
from infra.paths import REPO_ROOT
from online_rl.config import RolloutConfig
from online_rl.numerics import measure
from online_rl.rollouts import RolloutSource
from tests.helpers import GATEWAY_ADMIN, events_until, post

pytestmark = pytest.mark.timeout(600)


# Alone (tests/README.md): under pytest-xdist (2 workers, each file on one) it found 3.1e-3 where a serial run
# finds under 1e-5, the cause not pinned down (the load beside it, or what the session replica served before).
@pytest.mark.serial
def test_router_replay_matches_served_logprobs(replica, test_model):
    report = measure(replica.url, test_model, prompts=8, max_tokens=16)
    assert report["tokens"] > 20
    assert report["replay"]["routing_disagreement"] == 0.0
    assert report["replay"]["max_abs_logprob_diff"] <= 1e-5
    assert report["no_replay"]["max_abs_logprob_diff"] >= report["replay"]["max_abs_logprob_diff"] - 1e-7


def test_numerics_cli_prints_one_json_object(replica, test_model):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flywheel",
            "numerics",
            "--replica",
            replica.url,
            "--model",
            str(test_model),
            "--prompts",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", **replica_keys.env(replica_keys.inference_key())},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for mode in ("replay", "no_replay"):
        assert set(report[mode]) == {"max_abs_logprob_diff", "mean_abs_logprob_diff", "routing_disagreement"}


def test_rollouts_are_grouped_judged_and_tagged(gateway, test_model, kafka_bootstrap):
    cfg = json.loads((test_model / "config.json").read_text())
    src = RolloutSource(
        RolloutConfig(gateway_url=gateway.url, admin_token=GATEWAY_ADMIN, tasks_per_step=3, group_size=4, max_tokens=16)
    )
    samples, pass_rates = src.samples(step=0)
    assert len(pass_rates) == 3 and all(0.0 <= p <= 1.0 for p in pass_rates)
    assert len({s.group for s in samples}) == 3 and all(s.source == "rollout" for s in samples)
    for s in samples:
        assert s.routed_experts.shape == (
            s.prompt_ids.size + s.output_ids.size - 1,
            cfg["num_hidden_layers"],
            cfg["num_experts_per_tok"],
        )
        assert s.behaviour_logprobs.shape == s.output_ids.shape and 0.0 <= s.reward <= 1.0
    # The admin path needs the admin token, and its completions are logged as rollouts, not user traffic.
    assert post(f"{gateway.url}/admin/rollouts", {"prompt": "def f(x):\n", "n": 1}, key="key-alice")[0] == 401
    from contracts import events as ev
    from infra.kafka_admin import records_to_end

    ours = {s.key.rsplit("-", 1)[0] for s in samples}  # the completions these samples came from

    def logged(es) -> set[str]:
        return {e.completion_id for e in es} & ours

    events_until(kafka_bootstrap, ev.TOPIC_COMPLETIONS, lambda es: logged(es) == ours)  # shipped a moment later
    events = [ev.decode(r.value) for r in records_to_end(kafka_bootstrap, ev.TOPIC_COMPLETIONS)]
    assert logged(events) == ours and all(cid.startswith("rollout-") for cid in ours)
    assert {e.source for e in events if e.completion_id.startswith("rollout-")} == {"rollout"}
    assert np.isfinite([s.reward for s in samples]).all()
