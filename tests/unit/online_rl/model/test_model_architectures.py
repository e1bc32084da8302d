"""Checkpoints transformers writes (Qwen3-MoE, dense Qwen3, Llama), in the shapes of public ones scaled down,
load into the compact model with the same logits; what it cannot compute the same is refused by name."""

import copy
import json

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig, OptimConfig
from online_rl.data.samples import Sample
from online_rl.model.transformer import ModelConfig, MoECoder, load_pretrained, save_pretrained, token_logprobs
from online_rl.trainer.loss import advantages
from online_rl.trainer.update import make_optimizer, update

SMALL = dict(vocab_size=301, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def hf_config(arch: str):
    """transformers configs shaped like the public checkpoints (head_dim * heads != hidden as in Qwen3)."""
    import transformers as tf

    if arch == "qwen3_moe":  # Qwen3-30B-A3B: 128 experts, top-8, normalised top-k, rope_theta 1e6
        return tf.Qwen3MoeConfig(
            **SMALL,
            hidden_size=48,
            intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            norm_topk_prob=True,
            rope_theta=1e6,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
        )
    if arch == "qwen3":  # Qwen3-0.6B: dense, tied embeddings
        return tf.Qwen3Config(
            **SMALL, hidden_size=48, intermediate_size=96, tie_word_embeddings=True, rope_theta=1e6, eos_token_id=2
        )
    if arch == "llama":  # Llama-3.1-8B: llama3 RoPE, eos list; original context scaled so all three bands occur
        return tf.LlamaConfig(
            **SMALL,
            hidden_size=64,
            intermediate_size=96,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            bos_token_id=1,
            eos_token_id=[2, 3, 4],
        )
    assert arch == "llama_bias"  # Llama-2 RoPE, with both optional biases
    return tf.LlamaConfig(**SMALL, hidden_size=64, intermediate_size=96, attention_bias=True, mlp_bias=True)


ARCHS = ["qwen3_moe", "qwen3", "llama", "llama_bias"]


def build(arch: str, path, fused: bool = False):
    """A transformers model with every parameter perturbed (biases and norms too), saved to path."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config(arch)).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    if fused:  # the in-memory layout of transformers 5 (experts.gate_up_proj), written as is
        hf.config.save_pretrained(path)
        save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(path / "model.safetensors"))
    else:
        hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for arch in ARCHS:
        path = tmp_path_factory.mktemp(arch)
        out[arch] = build(arch, path), path
    return out


def tokens(seed: int, shape=(3, 29)) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_checkpoint_logits_match_fp32(checkpoints, arch):
    hf, path = checkpoints[arch]
    ours = load_pretrained(path, torch.float32).eval()
    assert ours.cfg.model_type == hf.config.model_type and ours.cfg.is_moe == (arch == "qwen3_moe")
    x = tokens(0)
    with torch.no_grad():
        out, theirs = ours(x), hf(x).logits
        if ours.cfg.is_moe:
            assert torch.equal(ours(x, replay_experts=out.experts).logits, out.logits)  # replay stays exact
    assert torch.allclose(out.logits, theirs, atol=1e-5, rtol=0), (out.logits - theirs).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_what_we_save(checkpoints, arch, tmp_path):
    from transformers import AutoModelForCausalLM

    ours = load_pretrained(checkpoints[arch][1], torch.float32).eval()
    save_pretrained(ours, tmp_path, torch.float32)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == ours.cfg.model_type and ModelConfig.from_hf(written) == ours.cfg
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    x = tokens(1)
    with torch.no_grad():
        a, b = ours(x).logits, hf(x).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()


def test_fused_experts_checkpoint_is_split(checkpoints, tmp_path):
    hf = build("qwen3_moe", tmp_path, fused=True)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "model.layers.0.mlp.experts.gate_up_proj" in f.keys()  # really the fused layout
    ours = load_pretrained(tmp_path, torch.float32).eval()
    x = tokens(2)
    with torch.no_grad():
        a, b = ours(x).logits, hf(x).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()


def test_dense_model_routes_nothing(checkpoints):
    m = load_pretrained(checkpoints["llama"][1]).eval()
    assert (m.cfg.moe_layers, m.cfg.num_experts, m.cfg.eos_ids) == (0, 0, {2, 3, 4})
    x = tokens(3, (2, 7))
    with torch.no_grad():
        out = m(x)
        replayed = m(x, replay_experts=torch.zeros(2, 7, 2, 2, dtype=torch.long))  # ignored: nothing to replay
    assert out.experts.shape == (2, 7, 0, 0) and float(out.aux_loss) == 0.0
    assert torch.equal(out.logits, replayed.logits)


@pytest.mark.parametrize("arch", ["llama", "llama_bias", "qwen3"])
def test_dense_batch_invariant_mode(checkpoints, arch):
    from kernels import batch_invariant as bi

    m = load_pretrained(checkpoints[arch][1]).eval()
    seq, batch = tokens(6, (1, 11)), tokens(7, (3, 19))
    batch[2, :11] = seq[0]
    with torch.no_grad():
        default = m(seq).logits
        with bi.mode(True):
            alone, inside = m(seq).logits, m(batch).logits
    assert torch.equal(inside[2, :11], alone[0])
    assert torch.allclose(alone, default, atol=1e-4)


def test_rope_spellings_agree():
    """transformers 5's rope_parameters and 4.x's rope_theta + rope_scaling (type or rope_type) read the same."""
    base = dict(model_type="llama", hidden_size=64, intermediate_size=96, max_position_embeddings=256, **SMALL)
    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    v5 = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **llama3}})
    v4 = ModelConfig.from_hf({**base, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **llama3}})
    v4_type = ModelConfig.from_hf({**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **llama3}})
    assert v5 == v4 == v4_type and v5.rope_theta == 5e5 and v5.rope_scaling["factor"] == 8.0
    plain = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain == ModelConfig.from_hf({**base, "rope_theta": 1e4, "rope_scaling": None})
    assert plain.rope_scaling is None


@pytest.mark.parametrize(
    "arch, change, match",
    [
        ("qwen3_moe", {"model_type": "qwen2_moe"}, "model_type='qwen2_moe'.*qwen3_moe"),
        ("qwen3_moe", {"model_type": "mixtral"}, "model_type='mixtral'"),
        ("qwen3", {"hidden_act": "gelu"}, "hidden_act"),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
        ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
        ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ("qwen3_moe", {"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
        ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
        ("llama", {"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.*linear"),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_unsupported_configs_are_refused_by_name(checkpoints, tmp_path, arch, change, match):
    d = {**json.loads((checkpoints[arch][1] / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        load_pretrained(tmp_path)


def test_idle_experts_run_with_zero_gradients_and_unchanged_output(checkpoints):
    """Every expert takes part in every forward (FSDP reduces the same gradients on every rank); the output
    is bit-identical to skipping the idle ones."""
    m = load_pretrained(checkpoints["qwen3_moe"][1])
    x = tokens(4, (1, 3))  # 3 tokens x top-2: at most 6 of 8 experts per layer
    out = m(x)
    (out.logits.sum() + out.aux_loss).backward()
    assert all(p.grad is not None for p in m.parameters())
    for i, layer in enumerate(m.model.layers):
        used = set(out.experts[0, :, i].flatten().tolist())
        assert len(used) < m.cfg.num_experts
        for e, expert in enumerate(layer.mlp.experts):
            assert all(p.grad.any() == (e in used) for p in expert.parameters()), (i, e)
    moe = m.model.layers[0].mlp
    h = torch.randn(3, m.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        y, ids, probs = moe(h)
        w = probs.gather(-1, ids)
        w = w / w.sum(-1, keepdim=True)
        ref = torch.zeros_like(h)
        for e, expert in enumerate(moe.experts):  # the old loop: idle experts skipped
            token, slot = torch.where(ids == e)
            if token.numel():
                ref.index_add_(0, token, expert(h[token]) * w[token, slot, None])
    assert torch.equal(y, ref)


def dense_samples(model: MoECoder) -> list[Sample]:
    """Two rollouts of one task, one rewarded; behaviour logprobs the model's own; routing as the dispatcher
    logs it when a replica returned none (no positions)."""
    prompt = np.array([5, 17, 42], np.int64)
    out = []
    for i, completion in enumerate(([7, 99, 3, 250], [8, 11, 200, 31])):
        seq = torch.from_numpy(np.concatenate([prompt, completion]))[None]
        with torch.no_grad():
            lp = token_logprobs(model(seq[:, :-1]).logits, seq[:, 1:])[0, prompt.size - 1 :].numpy()
        out.append(
            Sample(
                key=f"s{i}",
                prompt_ids=prompt,
                output_ids=np.array(completion, np.int64),
                behaviour_logprobs=lp.astype(np.float32),
                routed_experts=np.zeros((0, 2, 2), np.uint8),
                reward=float(i == 0),
                model_version=0,
                source="rollout",
                group="task",
            )
        )
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_update_trains_a_dense_model(checkpoints, arch):
    model = load_pretrained(checkpoints[arch][1]).train()
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    c = model.cfg
    samples = dense_samples(model)
    assert all(s.problem(c.vocab_size, c.moe_layers, c.num_experts_per_tok, c.num_experts) is None for s in samples)
    longest = max(s.prompt_ids.size + s.output_ids.size for s in samples)  # a trainer's length bound refuses more
    problems = [
        s.problem(c.vocab_size, c.moe_layers, c.num_experts_per_tok, c.num_experts, longest - 1) for s in samples
    ]
    assert any(p is not None and "max_sample_tokens" in p for p in problems)
    loss_cfg, optim_cfg = LossConfig(router_replay=True), OptimConfig(lr=1e-3)
    adv, _ = advantages(samples, loss_cfg, 0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m = update(model, ref, make_optimizer(model, optim_cfg), samples, adv, loss_cfg, optim_cfg)
    assert m["tokens"] == 8 and m["grad_norm"] > 0 and m["logprob_mismatch_max"] < 1e-5
    still = [k for k, v in model.state_dict().items() if torch.equal(v, before[k])]
    assert not still, still
