"""The trainer's compact Qwen3-MoE against transformers' implementation of the same checkpoint."""

import pytest
import torch

from online_rl.model.transformer import MoECoder, load_pretrained, save_pretrained, token_logprobs
from tests.tiny_models import TINY_MOE

TINY = TINY_MOE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    m = MoECoder(TINY)
    m.init_weights(1)
    path = tmp_path_factory.mktemp("tiny")
    save_pretrained(m, path, torch.float32)
    return m, path


def test_logits_match_transformers_fp32(tiny):
    from transformers import AutoModelForCausalLM

    m, path = tiny
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    x = torch.randint(0, TINY.vocab_size, (3, 29), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = m(x).logits, hf(x).logits
    assert ours.shape == (3, 29, TINY.vocab_size)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()


def test_router_replay_reproduces_own_routing(tiny):
    m, _ = tiny
    x = torch.randint(0, TINY.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        free = m(x)
        replayed = m(x, replay_experts=free.experts)
    assert free.experts.shape == (2, 17, TINY.num_hidden_layers, TINY.num_experts_per_tok)
    assert torch.equal(free.logits, replayed.logits)


def test_router_replay_forces_given_experts(tiny):
    m, _ = tiny
    x = torch.randint(0, TINY.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    forced = torch.zeros(1, 9, TINY.num_hidden_layers, TINY.num_experts_per_tok, dtype=torch.long)
    forced[..., 1] = 3  # experts 0 and 3 everywhere
    with torch.no_grad():
        out = m(x, replay_experts=forced)
        free = m(x)
    assert torch.equal(out.experts, forced)
    if not torch.equal(free.experts.sort(-1).values, forced.sort(-1).values):
        assert not torch.allclose(out.logits, free.logits)


def test_save_load_roundtrip_bf16(tiny, tmp_path):
    m, _ = tiny
    save_pretrained(m, tmp_path, torch.bfloat16)
    back = load_pretrained(tmp_path, torch.float32)
    for (k, a), (k2, b) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k == k2
        assert torch.equal(a.to(torch.bfloat16).float(), b)


def test_token_logprobs_shape_and_normalisation(tiny):
    m, _ = tiny
    x = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.no_grad():
        logits = m(x).logits
    lp = token_logprobs(logits[:, :-1], x[:, 1:])
    assert lp.shape == (2, 7) and (lp <= 0).all()
    # Summed over every possible target, the probabilities of one position are 1.
    every = torch.stack([token_logprobs(logits[:, :1], torch.full((2, 1), v)) for v in range(TINY.vocab_size)])
    assert torch.allclose(every.exp().sum(0), torch.ones(2, 1), atol=1e-5)


def test_load_rejects_wrong_checkpoint(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    with pytest.raises(ValueError, match="qwen3_moe"):
        load_pretrained(tmp_path)
