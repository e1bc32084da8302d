"""The trainer's model: a compact Qwen3-MoE (also the dense Qwen3 and Llama), loading and saving the
Hugging Face layout.

Same architecture and parameter names as transformers' `Qwen3MoeForCausalLM` (and SGLang's
`qwen3_moe`), so one checkpoint serves on SGLang and trains here:
  token embedding -> L x [RMSNorm -> GQA attention (per-head q/k RMSNorm, RoPE) -> residual,
                          RMSNorm -> sparse MoE (softmax router, top-k, renormalised) -> residual]
  -> RMSNorm -> lm_head.
The forward returns the experts every token was routed to, and takes `replay_experts` to force
given experts instead (router replay): the gate's probabilities of the forced experts still weight
their outputs, so the router keeps learning while the routing matches what serving did.

Architectures (config.json `model_type`; parsed and refused in online_rl.model.config):
  qwen3_moe  every layer sparse; experts per expert on disk, or transformers 5's fused gate_up_proj
  qwen3      dense SwiGLU `mlp.{gate,up,down}_proj`, q/k norm, tied embeddings or not
  llama      dense, no q/k norm, optional attention_bias and mlp_bias
  RoPE "default" or "llama3" (from `rope_parameters` or `rope_theta` + `rope_scaling`), silu, bf16/fp32
  safetensors. Refused with a ValueError naming the field: other model_types (qwen2_moe, mixtral, ...),
  other RoPE types or partial rotary, sliding windows in use, a qwen3_moe with dense layers
  (mlp_only_layers, decoder_sparse_step != 1), quantized checkpoints, hidden_act other than silu.
A dense model routes nothing: `Output.experts` is (B, T, 0, 0), aux_loss 0, replay is ignored;
`cfg.moe_layers` (0 there) is the L of the routing samples carry.

Shapes: B batch, T tokens, D hidden, H query heads, G kv heads, Dh head dim, E experts, K top-k,
L layers, V vocab.

Why one file: the modules, the forward and the Hugging Face layout it loads and saves name the same
parameters, read side by side; and its code is hashed into the base model's cache key
(online_rl.model.bootstrap.MODEL_CODE), which a split would change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import batch_invariant as bi
from online_rl.model.config import ModelConfig

__all__ = ["ModelConfig", "MoECoder", "Output", "load_pretrained", "save_pretrained", "token_logprobs"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bi.enabled():
            return bi.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Linear(nn.Linear):
    """nn.Linear (same parameters, same checkpoint names) that takes the batch-invariant path when on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # An idle expert runs on zero rows: nothing there to keep batch-invariant, and the kernels' paths
        # would return a tensor cut off from the weight (no gradient) or launch an empty grid.
        if not bi.enabled() or x.numel() == 0:
            return F.linear(x, self.weight, self.bias)
        y = bi.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


def rope_cache(cfg: ModelConfig, T: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, Dh), in the rotate-half layout transformers uses."""
    inv_freq = 1.0 / (
        cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=device).float() / cfg.head_dim)
    )  # (Dh/2,)
    if cfg.rope_scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, cfg.rope_scaling)
    t = torch.arange(T, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)  # (T, Dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, Dh)
    if bi.enabled():  # a position's angle must not depend on how long the batch is
        return emb.double().cos().float(), emb.double().sin().float()
    return emb.cos(), emb.sin()


def llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1's long-context RoPE (transformers' `_compute_llama3_parameters`, same float32 steps):
    wavelengths past the original context are stretched by `factor`, short ones kept, the band between
    interpolated."""
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / s["low_freq_factor"], old_len / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (old_len / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, heads, T, Dh); cos/sin: (T, Dh), float32: cast to x's dtype (as transformers does), so that a
    # bf16 forward (FSDP2's mixed precision) stays bf16 rather than promoting q and k alone to float32
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        D, H, G, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = Linear(D, H * Dh, bias=bias)
        self.k_proj = Linear(D, G * Dh, bias=bias)
        self.v_proj = Linear(D, G * Dh, bias=bias)
        self.o_proj = Linear(H * Dh, D, bias=bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(Dh, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(Dh, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """cache: generation's keys and values so far ({"k", "v"}: (B, G, Tpast, Dh), grown in place); with
        one, x is the tokens after them (the whole prompt first, then one at a time)."""
        B, T, _ = x.shape
        Dh = self.cfg.head_dim
        q, k = self.q_proj(x).view(B, T, -1, Dh), self.k_proj(x).view(B, T, -1, Dh)  # (B, T, H|G, Dh)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, Dh), (B, G, T, Dh)
        v = self.v_proj(x).view(B, T, -1, Dh).transpose(1, 2)  # (B, G, T, Dh)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        causal = True
        if cache is not None:
            if "k" in cache:  # one new token: it attends to every key so far
                k, v, causal = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2), False
            cache["k"], cache["v"] = k, v
        if bi.enabled():
            y = bi.causal_attention(q, k, v)  # (B, H, T, Dh)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, H, T, Dh)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: one routed expert of a MoE layer, or a dense model's whole MLP."""

    def __init__(self, D: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(D, inter, bias=bias)
        self.up_proj = Linear(D, inter, bias=bias)
        self.down_proj = Linear(inter, D, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = bi.silu if bi.enabled() else F.silu
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None = None):
        """x: (N, D); replay: (N, K) expert ids or None. Returns y (N, D), ids (N, K), probs (N, E)."""
        if bi.enabled():
            probs = bi.softmax(self.gate(x).float())  # (N, E)
        else:
            probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # (N, E)
        if replay is None:
            top = bi.topk if bi.enabled() else partial(torch.topk, dim=-1)
            weights, ids = top(probs, self.cfg.num_experts_per_tok)  # (N, K)
        else:
            ids = replay.long()
            weights = probs.gather(-1, ids)
        if self.cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        # Dispatch once: the (token, slot) pairs sorted by expert, one gather, a contiguous run of rows per
        # expert, one weighted copy back.
        N, K = ids.shape
        order = ids.reshape(-1).argsort(stable=True)  # (N*K,)
        counts = torch.bincount(ids.reshape(-1), minlength=self.cfg.num_experts).tolist()
        token = order // K  # (N*K,)
        outs = []
        for expert, rows in zip(self.experts, x[token].split(counts), strict=True):
            # With gradients on, every expert runs, on no rows when no token chose it: its weights then get
            # a zero gradient rather than none, so every data-parallel or FSDP rank reduces the same set.
            # Without (scoring, generation) an idle expert changes nothing and costs an empty pass: skip it.
            outs.append(rows if rows.shape[0] == 0 and not torch.is_grad_enabled() else expert(rows))
        out = torch.cat(outs) * weights.reshape(-1)[order, None]  # (N*K, D), sorted by expert
        # Back to (token, slot) order (unique indices: deterministic on GPUs too, where an index_add_ with a
        # token K times is atomic adds in no fixed order), then each token's K in slot order.
        y = x.new_zeros(N * K, x.shape[1]).index_copy(0, order, out).view(N, K, -1).sum(1)  # (N, D)
        return y, ids, probs


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg) if cfg.is_moe else MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, x, cos, sin, replay=None, cache=None):
        """x: (B, T, D); replay: (B, T, K) or None. Returns x, ids (B, T, K), probs (B, T, E); a dense
        layer routes nothing and returns None for both."""
        B, T, D = x.shape
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        if not isinstance(self.mlp, SparseMoE):
            return x + self.mlp(self.post_attention_layernorm(x)), None, None
        y, ids, probs = self.mlp(
            self.post_attention_layernorm(x).view(B * T, D), None if replay is None else replay.reshape(B * T, -1)
        )
        return x + y.view(B, T, D), ids.view(B, T, -1), probs.view(B, T, -1)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class Output:
    logits: torch.Tensor  # (B, T, V)
    experts: torch.Tensor  # (B, T, L, K): expert ids each token was routed to, per layer; (B, T, 0, 0) if dense
    aux_loss: torch.Tensor  # scalar: Switch-style load-balancing loss, mean over layers; 0 if dense


class MoECoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed: int) -> None:
        """GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
        g = torch.Generator().manual_seed(seed)
        resid_std = 0.02 / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                std = resid_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(
        self, idx: torch.Tensor, replay_experts: torch.Tensor | None = None, cache: list | None = None
    ) -> Output:
        """idx: (B, T) token ids; replay_experts: (B, T, L, K) expert ids to force, or None (always None
        for a dense model: it has no routing to replay); cache: generation's per-layer keys and values
        (a list of dicts, empty at first), idx then being the tokens after what it holds."""
        B, T = idx.shape
        if not self.cfg.is_moe:
            replay_experts = None
        past = cache[0]["k"].shape[2] if cache else 0
        cos, sin = rope_cache(self.cfg, past + T, idx.device)
        cos, sin = cos[past:], sin[past:]
        if cache is not None and not cache:
            cache.extend({} for _ in self.model.layers)
        x = self.model.embed_tokens(idx)  # (B, T, D)
        experts, aux = [], []
        for i, layer in enumerate(self.model.layers):
            replay = None if replay_experts is None else replay_experts[:, :, i]
            x, ids, probs = layer(x, cos, sin, replay, None if cache is None else cache[i])
            if ids is not None:
                experts.append(ids)
                aux.append(load_balance_loss(probs, ids, self.cfg.num_experts))
        logits = self.lm_head(self.model.norm(x))
        if not experts:  # dense
            return Output(logits, idx.new_zeros(B, T, 0, 0), torch.zeros((), device=idx.device))
        return Output(logits=logits, experts=torch.stack(experts, dim=2), aux_loss=torch.stack(aux).mean())

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        stop_ids: set[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> list[list[int]]:
        """Sample one completion per prompt; prompts must have equal length (no padding). The prompt is
        run once and its keys and values kept (agent clients' prompts run to thousands of tokens); each
        new token then costs one position. A completion ends before the first stop id (default: EOS)."""
        stop_ids = self.cfg.eos_ids if stop_ids is None else stop_ids
        assert len({len(p) for p in prompts}) == 1, "prompts of one call must have equal length"
        assert len(prompts[0]) + max_new_tokens <= self.cfg.max_position_embeddings, "longer than the model's positions"
        idx = torch.tensor(prompts, dtype=torch.long)  # (B, T)
        done = torch.zeros(len(prompts), dtype=torch.bool)
        stops = torch.tensor(sorted(stop_ids), dtype=torch.long)
        # batch-invariant kernels compute attention for a whole sequence at once: no cache there
        cache: list | None = None if bi.enabled() else []
        step = idx
        for _ in range(max_new_tokens):
            logits = self(step, cache=cache).logits[:, -1].float()  # (B, V)
            if temperature <= 0:
                nxt = logits.argmax(-1)
            else:
                nxt = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
            nxt = torch.where(done, stops[0], nxt)
            idx = torch.cat([idx, nxt[:, None]], dim=1)
            step = nxt[:, None] if cache is not None else idx
            done |= torch.isin(nxt, stops)
            if done.all():
                break
        out = []
        for row in idx[:, len(prompts[0]) :].tolist():
            cut = next((i for i, t in enumerate(row) if t in stop_ids), len(row))
            out.append(row[:cut])
        return out


def load_balance_loss(probs: torch.Tensor, ids: torch.Tensor, E: int) -> torch.Tensor:
    """E * sum_e (share of routing slots to e) * (mean router prob of e); 1.0 when perfectly balanced."""
    probs = probs.reshape(-1, E)
    share = F.one_hot(ids.reshape(-1), E).float().mean(0)
    return E * (share * probs.mean(0)).sum()


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T), computed in fp32."""
    logp = bi.log_softmax(logits.float()) if bi.enabled() else F.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, targets[..., None])[..., 0]


def save_pretrained(model: MoECoder, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """config.json + model.safetensors in the Hugging Face layout of cfg.model_type (per-expert tensors, as
    SGLang loads)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_word_embeddings:
        sd.pop("lm_head.weight")
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(model.cfg.hf_config(dtype_name), indent=2, sort_keys=True) + "\n")


def load_pretrained(path: Path, dtype: torch.dtype = torch.float32) -> MoECoder:
    """Load a checkpoint directory written by save_pretrained or by transformers (a supported
    architecture, safetensors shards); ValueError saying why for anything else."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    model = MoECoder(cfg)
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"checkpoint {path} has no *.safetensors (only safetensors checkpoints load)")
    sd = {}
    for f in shards:
        sd.update(load_file(str(f)))
    # Some older Llama checkpoints carry RoPE's inverse frequencies as a buffer; they come from the config.
    sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
    sd = split_fused_experts(sd, cfg)
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model.to(dtype)


def split_fused_experts(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers 5 holds a layer's experts fused (`mlp.experts.gate_up_proj` (E, 2I, D), gate rows
    first, and `mlp.experts.down_proj` (E, D, I)) and writes them per expert, as SGLang loads; a checkpoint
    saved fused anyway is split into the per-expert tensors here."""
    E, inter, D = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            if tuple(v.shape) != (E, 2 * inter, D):
                raise ValueError(f"{k}: fused shape {tuple(v.shape)}, want (E, 2I, D) = {(E, 2 * inter, D)}")
            for e in range(E):
                out[f"{k[: -len('gate_up_proj')]}{e}.gate_proj.weight"] = v[e, :inter]
                out[f"{k[: -len('gate_up_proj')]}{e}.up_proj.weight"] = v[e, inter:]
        elif k.endswith("mlp.experts.down_proj"):
            if tuple(v.shape) != (E, D, inter):
                raise ValueError(f"{k}: fused shape {tuple(v.shape)}, want (E, D, I) = {(E, D, inter)}")
            for e in range(E):
                out[f"{k[: -len('down_proj')]}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out
