"""Batch-invariant ops (CPU path): a row's result is bit-identical alone and inside batches of other
sizes and positions, and within tolerance of the float64 reference; the model in that mode likewise."""

import pytest
import torch

from kernels import batch_invariant as bi, reference as ref
from online_rl.model.transformer import ModelConfig, MoECoder

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


@pytest.mark.parametrize("K, N", [(64, 48), (96, 301), (7, 5), (2048, 512), (1024, 1024)])
def test_linear(K, N):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1))
    for row in rows(K):
        alone = bi.linear(row[None], w)[0]
        for b, i in batches(row, K):
            assert torch.equal(bi.linear(b, w)[i], alone)
        # a float32 dot product of K terms is within K * 2^-24 of sum |x_k w_k| (any summation order)
        bound = K * 2.0**-24 * (row.abs().double() @ w.abs().double().T)
        assert ((alone.double() - ref.linear(row, w)).abs() <= bound).all()


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


def test_linear_gives_a_row_the_same_bits_at_every_position_of_a_tile():
    K, N = 128, 1024  # the demo's LM head
    g = torch.Generator().manual_seed(6)
    w = torch.randn(N, K, generator=g)
    row = torch.randn(K, generator=g)
    alone = bi.linear(row[None], w)[0]
    batch = torch.randn(2 * bi.TILE + 3, K, generator=g)
    for i in range(2 * bi.TILE + 3):
        b = batch.clone()
        b[i] = row
        assert torch.equal(bi.linear(b, w)[i], alone), i


def test_attention_over_several_blocks_ignores_padding_and_other_sequences():
    g = torch.Generator().manual_seed(7)
    H, G, Dh, T = 4, 2, 16, bi.TILE + 9  # two blocks alone
    q, k, v = (
        torch.randn(1, H, T, Dh, generator=g),
        torch.randn(1, G, T, Dh, generator=g),
        torch.randn(1, G, T, Dh, generator=g),
    )
    alone = bi.causal_attention(q, k, v)
    for n, Tb, i in ((3, T, 2), (2, 3 * bi.TILE + 1, 1)):  # the same length; padded to four blocks
        Q, K_, V = (
            torch.randn(n, H, Tb, Dh, generator=g),
            torch.randn(n, G, Tb, Dh, generator=g),
            torch.randn(n, G, Tb, Dh, generator=g),
        )
        Q[i, :, :T], K_[i, :, :T], V[i, :, :T] = q[0], k[0], v[0]
        assert torch.equal(bi.causal_attention(Q, K_, V)[i, :, :T], alone[0])
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1), is_causal=True
    )
    assert torch.allclose(alone.double(), want, atol=1e-5)


def test_long_sequences_and_training_in_that_mode():
    m = MoECoder(TINY)
    m.init_weights(8)
    g = torch.Generator().manual_seed(9)
    seq = torch.randint(4, 301, (1, bi.TILE + 20), generator=g)
    with bi.mode(True):
        with torch.no_grad():
            alone = m(seq)
            batch = torch.randint(4, 301, (3, 2 * bi.TILE + 40), generator=g)
            batch[1, : seq.shape[1]] = seq[0]
            out = m(batch)
        assert torch.equal(out.logits[1, : seq.shape[1]], alone.logits[0])
        m(seq).logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    m(seq).logits.float().logsumexp(-1).mean().backward()
    for n, p in m.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, rtol=1e-3, atol=1e-5), n
