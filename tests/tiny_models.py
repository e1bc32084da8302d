"""Model configs small enough for unit tests to build and run in milliseconds."""

from online_rl.model.transformer import ModelConfig

# Two MoE layers of 4 experts, top-2, grouped-query attention: every path of MoECoder, at toy size.
TINY_MOE = ModelConfig(
    vocab_size=301,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
)
