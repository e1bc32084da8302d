"""Section 4 of the prepared GPU check: the batch-invariant forward against the default one.

One row's logits and expert choices, computed in batches of different sizes and at different positions,
are compared bit for bit with the row's result in the full batch: with kernels.batch_invariant on they must
be identical (the section's "ok"); with it off the same comparison is only measured. Also timed: the
batch-invariant forward against the default (no TF32 either way), and how far the two modes' logits are.
"""

from __future__ import annotations

import torch

from kernels import batch_invariant as bi
from online_rl.gpu_check.sections import Budget, wall_bench
from online_rl.model.transformer import ModelConfig, MoECoder

# ~0.11 B parameters: big enough for real kernel shapes, small enough for the Python-loop attention of the
# batch-invariant path (bi.causal_attention walks the keys one by one)
BI_CFG = ModelConfig(
    vocab_size=8192,
    hidden_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
    max_position_embeddings=256,
)
ROW = 2
SLICES = ((2, 3), (2, 5), (1, 4), (0, 3))  # [a, b): row 2 alone, first of 3, second of 3, last of 3


def _compare(model: MoECoder, idx: torch.Tensor) -> tuple[dict, torch.Tensor]:
    full = model(idx)
    want_logits, want_experts = full.logits[ROW], full.experts[ROW]
    same_logits = same_experts = True
    max_diff = 0.0
    for a, b in SLICES:
        out = model(idx[a:b])
        logits, experts = out.logits[ROW - a], out.experts[ROW - a]
        same_logits &= torch.equal(logits, want_logits)
        same_experts &= torch.equal(experts, want_experts)
        max_diff = max(max_diff, float((logits - want_logits).abs().max()))
    result = {"logits_identical": same_logits, "experts_identical": same_experts, "max_abs_diff": max_diff}
    return result, full.logits


@torch.no_grad()
def batch_invariance(
    budget: Budget, device: torch.device, cfg: ModelConfig = BI_CFG, batch: int = 8, seq: int = 128, log=print
) -> dict:
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.device("meta"):
            model = MoECoder(cfg)
        model.to_empty(device=device)
        model.init_weights(seed=0)
        model.eval()
        g = torch.Generator().manual_seed(3)
        idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
        result: dict = {"batch": batch, "seq": seq, "row": ROW, "slices": [list(s) for s in SLICES]}
        logits = {}
        for on in (True, False):
            key = "batch_invariant" if on else "default"
            with bi.mode(on):
                result[key], logits[key] = _compare(model, idx)
                result[key]["forward_s"] = round(wall_bench(lambda: model(idx), device, reps=3), 4)
            log(f"  {key}: {result[key]}")
        result["slowdown"] = round(result["batch_invariant"]["forward_s"] / result["default"]["forward_s"], 2)
        diff = (logits["batch_invariant"] - logits["default"]).abs()
        result["modes_max_abs_diff"] = float(diff.max())
        result["modes_logit_scale"] = float(logits["default"].abs().max())
        on = result["batch_invariant"]
        result["ok"] = on["logits_identical"] and on["experts_identical"]
        return result
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
