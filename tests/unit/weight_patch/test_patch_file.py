"""A patch laid out before it is filled (weight_patch.writer.PatchFile): the same file as PatchWriter makes of the
same arrays, read back by numpy and torch alike, widths mixed (int64 positions past 2**31 elements)."""

import numpy as np
import pytest
from safetensors import safe_open

from weight_patch import format as wp, reader, writer as patch_writer

VIEWS = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}
ENTRIES = [
    ("a.w", "BF16", [8, 16], 5),
    ("b.w", "F32", [4, 4], None),
    ("c.w", "BF16", [3], 0),
    ("d.w", "F16", [100], 70),
    ("e.w", "F32", [50], 7),
    ("huge.w", "BF16", [2**31 + 8], 3),  # positions as int64: never allocated, only laid out
]


def test_a_patch_file_is_what_the_patch_writer_writes(tmp_path):
    rng = np.random.default_rng(0)
    want = patch_writer.PatchWriter()
    with patch_writer.PatchFile(tmp_path / "laid-out.safetensors", ENTRIES) as f:
        for name, dtype, shape, k in ENTRIES:
            view, numel = VIEWS[dtype], int(np.prod(shape))
            if k is None:
                bits = rng.integers(0, 2**15, numel).astype(view)
                f.whole(name)[:] = bits.view(f.whole(name).dtype)
                want.whole(name, dtype, shape, bits)
                continue
            idx = np.sort(rng.choice(min(numel, 10**6), k, replace=False)).astype(patch_writer.index_dtype(numel))
            xor = rng.integers(1, 2**15, k).astype(view)
            base = rng.integers(0, 2**15, int(idx.max()) + 1 if k else 0).astype(view)
            i, x, was = f.sparse(name)
            assert i.dtype == idx.dtype and i.size == k and was.size == min(k, wp.WAS_SAMPLE)
            i[:], x[:], was[:] = idx, xor.view(x.dtype), base[idx[: was.size]].view(was.dtype)
            want.sparse(name, dtype, shape, idx, xor, base)
        size = f.size
    want.write(tmp_path / "written.safetensors")
    assert size == (tmp_path / "laid-out.safetensors").stat().st_size
    for framework in ("numpy", "pt"):
        with (
            safe_open(str(tmp_path / "laid-out.safetensors"), framework) as a,
            safe_open(str(tmp_path / "written.safetensors"), framework) as b,
        ):
            assert a.metadata() == b.metadata() and set(a.keys()) == set(b.keys())
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                assert x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape) and (x == y).all(), key
    got = {e.name: e for e in reader.entries(tmp_path / "laid-out.safetensors")}
    assert got.keys() == {name for name, *_ in ENTRIES} and got["b.w"].whole is not None


def test_a_patch_file_refuses_what_no_tensor_can_hold(tmp_path):
    with pytest.raises(ValueError, match="changed of"):
        patch_writer.PatchFile(tmp_path / "p.safetensors", [("a.w", "BF16", [4], 5)])
    with pytest.raises(ValueError, match="named twice"):
        patch_writer.PatchFile(tmp_path / "p.safetensors", [("a.w", "BF16", [4], 1), ("a.w", "BF16", [4], None)])
    with pytest.raises(ValueError, match="no patch form"):
        patch_writer.PatchFile(tmp_path / "p.safetensors", [("a.w", "I8", [4], 1)])
