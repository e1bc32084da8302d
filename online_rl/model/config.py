"""The model's dimensions, and their Hugging Face config.json both ways (online_rl.model.transformer builds the model).

`ModelConfig.from_hf` reads a transformers config of a supported architecture and refuses, with the field
and what is supported, anything the compact model would compute differently; `hf_config` writes one that
transformers and SGLang load. A qwen3_moe config is written with exactly the keys and values it always
had: the checkpoints SGLang serves must not change.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_COMMON = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)
_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")


@dataclass
class ModelConfig:
    vocab_size: int = 1024
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8  # 0 in a dense model
    num_experts_per_tok: int = 2  # 0 in a dense model
    moe_intermediate_size: int = 128  # 0 in a dense model
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] = 0  # Llama 3 lists several
    model_type: str = "qwen3_moe"  # a key of SUPPORTED
    intermediate_size: int = 0  # the dense MLP's width (qwen3, llama); unused by qwen3_moe
    attention_bias: bool = False  # q/k/v/o projections with bias
    mlp_bias: bool = False  # llama only: gate/up/down projections with bias
    rope_scaling: dict | None = None  # None, or llama3's {rope_type, factor, low/high_freq_factor, original_max_...}

    def __post_init__(self):
        if self.model_type not in SUPPORTED:
            raise ValueError(f"model_type={self.model_type!r} is not supported; supported: {sorted(SUPPORTED)}")
        if not self.is_moe:
            # Dense: no routed experts, so replay and the samples' routing shape have nothing to check.
            self.num_experts = self.num_experts_per_tok = self.moe_intermediate_size = 0
            if self.intermediate_size <= 0:
                raise ValueError(f"a dense {self.model_type} needs intermediate_size > 0")

    @property
    def is_moe(self) -> bool:
        return self.model_type == "qwen3_moe"

    @property
    def moe_layers(self) -> int:
        """Layers with a router: the L of routed experts (B, T, L, K); 0 in a dense model."""
        return self.num_hidden_layers if self.is_moe else 0

    @property
    def qk_norm(self) -> bool:
        return self.model_type != "llama"  # Qwen3 normalises each head's q and k; Llama does not

    @property
    def eos_ids(self) -> set[int]:
        return set(self.eos_token_id) if isinstance(self.eos_token_id, list) else {self.eos_token_id}

    def hf_config(self, torch_dtype: str = "bfloat16") -> dict:
        """config.json for the Hugging Face layout (architecture SUPPORTED[model_type])."""
        d = {k: getattr(self, k) for k in _COMMON}
        d.update(
            architectures=[SUPPORTED[self.model_type]],
            model_type=self.model_type,
            hidden_act="silu",
            attention_bias=self.attention_bias,
            attention_dropout=0.0,
            rope_scaling=self.rope_scaling,  # the spelling SGLang reads; transformers 5 reads it too
            use_cache=True,
            initializer_range=0.02,
            torch_dtype=torch_dtype,
            pad_token_id=min(self.eos_ids),
        )
        if self.model_type == "llama":
            d.update(intermediate_size=self.intermediate_size, mlp_bias=self.mlp_bias, pretraining_tp=1)
            return d
        d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        if self.model_type == "qwen3":
            d.update(intermediate_size=self.intermediate_size)
            return d
        d.update({k: getattr(self, k) for k in _MOE})
        d.update(
            intermediate_size=self.moe_intermediate_size * self.num_experts_per_tok,  # dense MLP: unused
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=0.001,
            output_router_logits=False,
        )
        return d

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        """A transformers config.json (4.x or 5.x spelling); ValueError naming the field it cannot take."""
        mt = d.get("model_type")
        if mt not in SUPPORTED:
            raise ValueError(
                f"model_type={mt!r} is not supported: the trainer implements "
                + ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
            )
        _refuse(d, "hidden_act", d.get("hidden_act", "silu") != "silu", "only silu is supported")
        _refuse(d, "quantization_config", d.get("quantization_config"), "quantized checkpoints are not supported")
        _refuse(d, "use_sliding_window", d.get("use_sliding_window"), "sliding-window attention is not supported")
        layer_types = d.get("layer_types") or []
        _refuse(
            d,
            "layer_types",
            any(t != "full_attention" for t in layer_types),
            "only full_attention layers are supported",
        )
        need = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
        need += ["num_experts_per_tok", "moe_intermediate_size"] if mt == "qwen3_moe" else ["intermediate_size"]
        lost = [k for k in need if k not in d]
        if mt == "qwen3_moe" and "num_experts" not in d and "num_local_experts" not in d:
            lost.append("num_experts")
        if lost:
            raise ValueError(f"{mt} config lacks {lost}")
        heads = d["num_attention_heads"]
        out = {k: d[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
        out.update(
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", cls.max_position_embeddings),
            rms_norm_eps=d.get("rms_norm_eps", cls.rms_norm_eps),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id") if d.get("eos_token_id") is not None else cls.eos_token_id,
            model_type=mt,
            attention_bias=bool(d.get("attention_bias", False)),
        )
        out["rope_theta"], out["rope_scaling"] = _rope(d)
        if mt == "qwen3_moe":
            _refuse(d, "mlp_only_layers", d.get("mlp_only_layers"), "every layer must be sparse (want [])")
            _refuse(
                d, "decoder_sparse_step", d.get("decoder_sparse_step", 1) != 1, "every layer must be sparse (want 1)"
            )
            out.update(
                num_experts=d.get("num_experts", d.get("num_local_experts")),  # transformers 5 writes the latter
                num_experts_per_tok=d["num_experts_per_tok"],
                moe_intermediate_size=d["moe_intermediate_size"],
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),  # transformers' default
            )
        else:
            out["intermediate_size"] = d["intermediate_size"]
            if mt == "llama":
                out["mlp_bias"] = bool(d.get("mlp_bias", False))
        return cls(**out)


def _refuse(d: dict, field: str, bad, why: str) -> None:
    if bad:
        raise ValueError(f"{d.get('model_type')} config: {field}={d.get(field)!r}: {why}")


def _rope(d: dict) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) from transformers 5's `rope_parameters` or 4.x's `rope_theta` and
    `rope_scaling`; other RoPE variants change every position's angle, so they are refused."""
    params = d.get("rope_scaling") or d.get("rope_parameters") or {}  # transformers' own precedence
    _refuse(d, "rope_parameters", any(isinstance(v, dict) for v in params.values()), "one RoPE for all layers")
    theta = float(params.get("rope_theta", d.get("rope_theta", ModelConfig.rope_theta)))
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    _refuse(d, "partial_rotary_factor", partial not in (None, 1, 1.0), "only full rotary (1.0) is supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        field = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
        raise ValueError(f"{d.get('model_type')} config: {field} rope_type={kind!r}: supported {list(ROPE_TYPES)}")
    if kind == "default":
        return theta, None
    scaling = {"rope_type": "llama3"}
    for k in _LLAMA3_KEYS:
        default = d.get("max_position_embeddings") if k == "original_max_position_embeddings" else None
        if params.get(k, default) is None:
            raise ValueError(f"{d.get('model_type')} config: llama3 rope without {k}")
        scaling[k] = params.get(k, default)  # type: ignore[assignment]  # model code
    return theta, scaling
