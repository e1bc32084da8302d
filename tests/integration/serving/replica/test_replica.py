"""A real SGLang replica (CPU flags + compat layer) serving the bootstrapped test model."""

import base64
import json
import urllib.request

import numpy as np
import pytest
import torch

from contracts import replica_keys

pytestmark = pytest.mark.timeout(600)

PROMPTS = [
    'def add_three(x):\n    """Return x plus 3."""\n',
    'def keep_above_five(values):\n    """Return the items of values greater than 5."""\n',
    "def test_shout_two():\n",
]


def _generate(url, payload):
    req = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **replica_keys.inference_headers()},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_a_ready_replica_listens_on_the_port_held_for_it(replica):
    """Its port was reserved at launch (no port given); once it listens the hold is gone, and the replica's
    own listener keeps the port from a plain bind."""
    import socket

    assert replica.port_hold is None
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", replica.port))


def test_generate_returns_logprobs_and_routed_experts(replica, test_model):
    cfg = json.loads((test_model / "config.json").read_text())
    out = _generate(
        replica.url,
        {
            "text": PROMPTS[0],
            "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True},
            "return_logprob": True,
            "return_routed_experts": True,
        },
    )
    meta = out["meta_info"]
    n_out = meta["completion_tokens"]
    assert n_out == 12 and len(out["output_ids"]) == 12
    lps = meta["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    assert all(lp <= 0 for lp, _, _ in lps)
    experts = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
    L, K = cfg["num_hidden_layers"], cfg["num_experts_per_tok"]
    total = meta["prompt_tokens"] + n_out - 1  # every position that went through the model
    experts = experts.reshape(total, L, K)
    assert experts.min() >= 0 and experts.max() < cfg["num_experts"]
    assert all(len(set(row)) == K for row in experts.reshape(-1, K).tolist())  # top-k picks distinct experts
    assert meta["weight_version"] == "0"


def test_served_routing_and_logprobs_match_the_trainer_model(replica, test_model):
    """Our model recomputes the served tokens: same experts, logprobs within float32 noise."""
    from transformers import AutoTokenizer

    from online_rl.model.transformer import load_pretrained, token_logprobs

    tok = AutoTokenizer.from_pretrained(test_model)
    model = load_pretrained(test_model).eval()
    out = _generate(
        replica.url,
        {
            "text": PROMPTS[1],
            "sampling_params": {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True},
            "return_logprob": True,
            "return_routed_experts": True,
        },
    )
    prompt_ids = tok(PROMPTS[1])["input_ids"]
    ids = torch.tensor([prompt_ids + out["output_ids"]])
    with torch.no_grad():
        res = model(ids[:, :-1])
    served = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    ours = token_logprobs(res.logits, ids[:, 1:])[0, len(prompt_ids) - 1 :]
    # Same float32 arithmetic up to reduction order (the 1e-5 figure with router replay is online_rl's).
    assert (ours - served).abs().max().item() < 1e-4
    experts = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), dtype=np.int32)
    experts = torch.from_numpy(experts.copy()).view(ids.shape[1] - 1, model.cfg.num_hidden_layers, -1)
    agree = (experts.sort(-1).values == res.experts[0].sort(-1).values).all(-1).float().mean().item()
    assert agree > 0.95


def test_checkpoint_loads_in_transformers_and_greedy_matches_sglang(replica, test_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(test_model)
    hf = AutoModelForCausalLM.from_pretrained(test_model, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            # The explicit mask matters: the leading <|endoftext|> doubles as pad, and generate() would
            # otherwise mask it out.
            hf_out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=tok.pad_token_id,
                min_new_tokens=24,
            )[0, ids.shape[1] :].tolist()
        sg = _generate(
            replica.url,
            {
                "input_ids": ids[0].tolist(),
                "sampling_params": {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True},
            },
        )
        assert sg["output_ids"] == hf_out, f"greedy diverged for {prompt!r}"
