"""Batch-invariant ops (CPU path): a row's result is bit-identical alone and inside batches of other
sizes and positions, and within tolerance of the float64 reference; the model in that mode likewise."""

import pytest
import torch

from kernels import batch_invariant as bi, reference as ref
from online_rl.model import ModelConfig, MoECoder

SIZES = (1, 3, 17, 64)


def batches(row: torch.Tensor, seed: int):
    """The row inside batches of other rows, at varying positions: (batch, index of the row)."""
    g = torch.Generator().manual_seed(seed)
    for n in SIZES:
        b = torch.randn(n, *row.shape, generator=g) * row.abs().max()
        i = int(torch.randint(0, n, (1,), generator=g))
        b[i] = row
        yield b, i


def rows(dim: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(dim, generator=g) * s for s in (1e-3, 1.0, 30.0)]


@pytest.mark.parametrize("K, N", [(64, 48), (96, 301), (7, 5)])
def test_linear(K, N):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1))
    for row in rows(K):
        alone = bi.linear(row[None], w)[0]
        for b, i in batches(row, K):
            assert torch.equal(bi.linear(b, w)[i], alone)
        assert torch.allclose(alone.double(), ref.linear(row, w), rtol=1e-5, atol=1e-5 * row.abs().max().item())


@pytest.mark.parametrize(
    "op, reference, D",
    [
        (bi.softmax, ref.softmax, 8),
        (bi.softmax, ref.softmax, 301),
        (bi.log_softmax, ref.log_softmax, 301),
        (bi.log_softmax, ref.log_softmax, 1000),
        (
            lambda x: bi.rms_norm(x, torch.linspace(0.5, 2, x.shape[-1]), 1e-6),
            lambda x: ref.rms_norm(x, torch.linspace(0.5, 2, x.shape[-1]), 1e-6),
            64,
        ),
    ],
)
def test_rowwise(op, reference, D):
    for row in rows(D, seed=D):
        alone = op(row[None])[0]
        for b, i in batches(row, D):
            assert torch.equal(op(b)[i], alone)
        assert torch.allclose(alone.double(), reference(row[None])[0], rtol=1e-5, atol=1e-6)


def test_topk_breaks_ties_to_the_lower_index():
    x = torch.tensor([[0.1, 0.3, 0.3, 0.05, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]])
    values, ids = bi.topk(x, 2)
    assert ids.tolist() == [[1, 2], [0, 1]]
    r_values, r_ids = ref.topk(x, 2)
    assert torch.equal(ids, r_ids) and torch.equal(values, r_values)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(50, 8, generator=g), -1)
    for b, i in batches(probs[7], 3):
        assert torch.equal(bi.topk(b, 2)[1][i], bi.topk(probs[7:8], 2)[1][0])


TINY = ModelConfig(
    vocab_size=301,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
)


def test_model_forward_is_batch_invariant_in_that_mode():
    m = MoECoder(TINY).eval()
    m.init_weights(5)
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(4, 301, (1, 13), generator=g)
    with torch.no_grad(), bi.mode(True):
        alone = m(seq)
        for n, T, i in ((3, 13, 1), (5, 29, 4), (2, 40, 0)):  # other rows, longer (padded) batches
            batch = torch.randint(4, 301, (n, T), generator=g)
            batch[i, :13] = seq[0]
            out = m(batch)
            assert torch.equal(out.logits[i, :13], alone.logits[0])
            assert torch.equal(out.experts[i, :13], alone.experts[0])
    with torch.no_grad():
        default = m(seq)
    assert not bi.enabled()
    assert torch.allclose(alone.logits, default.logits, atol=1e-4)
    assert (alone.experts == default.experts).float().mean() > 0.95  # near-ties may route differently
