"""Delta kernels (numpy path): bit-exact against the element-by-element reference, special values included."""

import numpy as np
import pytest

from kernels import delta, reference as ref

SPECIAL_BF16 = np.array(
    [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x0001, 0x8001, 0x007F, 0x3F80, 0xBF80], np.uint16
)  # +-0, +-inf, NaN, all ones, denormals, +-1.0
SPECIAL_F32 = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 1, 0x3F800000], np.uint32)


def cases(view, special, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(view)
    base = rng.integers(0, info.max, 3000, dtype=view, endpoint=True)
    new = base.copy()
    flip = rng.random(base.size) < 0.1
    new[flip] ^= rng.integers(1, info.max, flip.sum(), dtype=view, endpoint=True)
    yield new, base
    yield np.concatenate([special, special[::-1]]), np.concatenate([special[::-1], special])
    yield special, special  # nothing changed
    yield new[:1], base[:1]


@pytest.mark.parametrize("view, special", [(np.uint16, SPECIAL_BF16), (np.uint32, SPECIAL_F32)])
def test_xor_split_join_count_against_the_reference(view, special):
    for new, base in cases(view, special, seed=np.dtype(view).itemsize):
        x, planes, changed = delta.xor_split(new, base)
        want_planes, want_changed = ref.xor_split(new, base)
        assert np.array_equal(planes, want_planes) and changed == want_changed
        assert np.array_equal(x, new ^ base)
        assert np.array_equal(delta.join_planes(planes, view, new.size), x)
        assert np.array_equal(delta.xor(x, base), new)  # XOR again: the new bits back


def test_full_snapshot_has_no_base():
    new = SPECIAL_BF16
    x, planes, changed = delta.xor_split(new, None)
    assert changed == new.size and np.array_equal(delta.join_planes(planes, np.uint16, new.size), new)


def test_mismatches_are_clear_errors():
    with pytest.raises(ValueError, match="equal dtypes"):
        delta.xor(SPECIAL_BF16, SPECIAL_F32)
    with pytest.raises(ValueError, match="plane bytes"):
        delta.join_planes(np.zeros(5, np.uint8), np.uint16, 3)


def test_backend_follows_the_machine():
    import torch

    assert delta.backend() == ("triton" if torch.cuda.is_available() else "numpy")


@pytest.fixture(params=["numba", "numpy"])
def path(request, monkeypatch):
    """Each fused loop and its numpy counterpart (what runs where numba does not import)."""
    if request.param == "numpy":
        monkeypatch.setattr(delta, "cpu_ops", lambda: None)
    else:
        assert delta.cpu_ops() is not None, "numba comes with SGLang"
    return request.param


@pytest.mark.parametrize("view, special", [(np.uint16, SPECIAL_BF16), (np.uint32, SPECIAL_F32)])
def test_a_sparse_chunk_decodes_to_its_positions_and_xor(path, view, special):
    from weight_sync import codec

    for new, base in cases(view, special, seed=3):
        frame, encoding, k = codec.encode_chunk(new, base)
        meta = codec.ChunkMeta(1000, new.size, encoding, len(frame), codec.digest(frame), k)
        for idx_dtype in (np.int32, np.int64):
            idx, x = np.empty(k, idx_dtype), np.empty(k, view)
            codec.changes_into(frame, meta, view, idx, x)
            want = np.flatnonzero(new != base)
            assert np.array_equal(idx, want + 1000) and np.array_equal(x, new[want] ^ base[want])
            bits = base.copy()
            delta.xor_scatter(bits, idx - 1000, x)
            assert np.array_equal(bits, new)  # the XOR on the base is the new version, bit for bit


def test_a_sparse_payload_pointing_past_its_chunk_is_refused(path):
    body = np.array([9, 0, 0, 0, 1, 0], np.uint8)  # one change, gap 9: position 9 of a 5-element chunk
    with pytest.raises(ValueError, match="past its end"):
        delta.sparse_xor(body, 1, 5, 0, np.empty(1, np.int32), np.empty(1, np.uint16))
    with pytest.raises(ValueError, match="sparse payload"):
        delta.sparse_xor(body[:5], 1, 5, 0, np.empty(1, np.int32), np.empty(1, np.uint16))


def test_xor_scatter_puts_a_bf16_xor_into_float32_bits_and_refuses_what_does_not_fit(path):
    import torch

    rng = np.random.default_rng(0)
    base = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).to(torch.bfloat16)
    new = base.clone()
    idx = np.array([0, 5, 63], np.int64)
    new[idx] = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    x = (new.view(torch.int16).numpy() ^ base.view(torch.int16).numpy()).view(np.uint16)[idx]
    held = base.float().numpy().view(np.uint32).copy()  # a float32 replica holding the bf16 base
    delta.xor_scatter(held, idx, x, shift=16)
    assert np.array_equal(held.view(np.float32), new.float().numpy())
    with pytest.raises(ValueError, match="outside"):
        delta.xor_scatter(held, np.array([64], np.int64), x[:1], shift=16)
    with pytest.raises(ValueError, match="unsigned bits"):
        delta.xor_scatter(held.view(np.int32), idx, x)
    with pytest.raises(ValueError, match="unsigned bits"):
        delta.xor_scatter(np.zeros(4, np.uint16), idx[:1], x[:1], shift=16)


# ----------------------------------------------------------------- the codec's one-pass scan and its inverse

VIEWS = [np.uint8, np.uint16, np.uint32, np.uint64]


def pairs(view, seed):
    """(new, base) pairs for the whole-chunk passes: empty, one element, sizes around the SIMD step (16) and
    the block (4096), none / a few / all changed, special values."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(view)
    for n, share in [(0, 0), (1, 0), (1, 1), (15, 0.5), (17, 0.2), (4095, 0.01), (4097, 0.3), (9001, 1), (9001, 0)]:
        base = rng.integers(0, info.max, n, dtype=view, endpoint=True)
        new = base.copy()
        flip = rng.random(n) < share
        new[flip] ^= rng.integers(1, info.max, int(flip.sum()), dtype=view, endpoint=True)
        yield new, base
    special = {np.uint16: SPECIAL_BF16, np.uint32: SPECIAL_F32}.get(view)
    if special is not None:
        yield np.concatenate([special, special[::-1]]), np.concatenate([special[::-1], special])


def readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("view", VIEWS)
def test_scan_writes_the_planes_count_and_positions_of_the_reference(path, view):
    for new, base in pairs(view, seed=np.dtype(view).itemsize):
        x = new ^ base
        want_planes, want_changed = (
            ref.xor_split(new, base) if view in (np.uint16, np.uint32) else (delta.split_planes(x), np.count_nonzero(x))
        )
        for cap in {0, want_changed - 1, want_changed, new.size}:
            for n_in, b_in in ((new, base), (readonly(new), readonly(base))):
                planes, positions, changed = delta.scan(n_in, b_in, cap)
                assert np.array_equal(planes, want_planes) and changed == want_changed
                if changed <= max(cap, 0):
                    assert positions.dtype == np.uint32 and np.array_equal(positions, np.flatnonzero(x))
                else:
                    assert positions is None
        planes, positions, changed = delta.scan(new, None, new.size)  # a full snapshot: the raw bits
        assert positions is None and changed == new.size and np.array_equal(planes, delta.split_planes(new))


def test_scan_scratch_is_reused_and_refuses_what_it_cannot_scan(path):
    scratch = delta.Scratch()
    new, base = next(p for p in pairs(np.uint16, 0) if p[0].size > 4000)
    first, _, _ = delta.scan(new, base, new.size, scratch)
    again, positions, changed = delta.scan(new[:100], base[:100], 100, scratch)
    assert np.array_equal(again, delta.split_planes(new[:100] ^ base[:100]))
    assert np.array_equal(positions, np.flatnonzero(new[:100] != base[:100])) and changed == positions.size
    if path == "numba":
        assert np.shares_memory(first, again)  # the same pages, not fresh ones each chunk
    with pytest.raises(ValueError, match="equal dtypes"):
        delta.scan(new, base.astype(np.uint32), 1)
    with pytest.raises(ValueError, match="unsigned bits"):
        delta.scan(new.view(np.int16), base.view(np.int16), 1)


@pytest.mark.parametrize("view", VIEWS)
def test_join_xor_and_sparse_patch_rebuild_the_new_bits(path, view):
    for new, base in pairs(view, seed=7):
        n, itemsize = new.size, new.itemsize
        planes = delta.split_planes(new ^ base)
        for p_in, b_in in ((planes, base), (readonly(planes), readonly(base))):
            assert np.array_equal(delta.join_xor(p_in, b_in, np.full(n, 7, view)), new)
        assert np.array_equal(delta.join_xor(delta.split_planes(new), None, np.empty(n, view)), new)
        positions = np.flatnonzero(new != base).astype(np.uint32)
        k = positions.size
        body = np.empty((4 + itemsize) * k, np.uint8)
        delta.sparse_payload(positions, planes, n, body)
        gaps = np.diff(positions.astype(np.int64), prepend=-1) - 1
        assert np.array_equal(body[: 4 * k], delta.split_planes(gaps.astype(np.uint32)))  # the codec's format
        assert np.array_equal(body[4 * k :], delta.split_planes((new ^ base)[positions]))
        for b_in, body_in in ((base, body), (readonly(base), readonly(body))):
            assert np.array_equal(delta.sparse_patch(body_in, k, b_in, np.full(n, 7, view)), new)
        in_place = base.copy()
        assert delta.sparse_patch(body, k, None, in_place) is in_place and np.array_equal(in_place, new)


def test_a_sparse_patch_past_its_chunk_and_mismatched_buffers_are_refused(path):
    body = np.array([9, 0, 0, 0, 1, 0], np.uint8)  # one change, gap 9: position 9 of a 5-element chunk
    with pytest.raises(ValueError, match="past its end"):
        delta.sparse_patch(body, 1, np.zeros(5, np.uint16), np.zeros(5, np.uint16))
    with pytest.raises(ValueError, match="sparse payload"):
        delta.sparse_patch(body[:5], 1, np.zeros(5, np.uint16), np.zeros(5, np.uint16))
    with pytest.raises(ValueError, match="join_xor"):
        delta.join_xor(np.zeros(9, np.uint8), None, np.zeros(5, np.uint16))
