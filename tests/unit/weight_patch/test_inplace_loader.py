"""The engine-side in-place loader (weight_patch.loader) on small models whose `load_weights` lays tensors
out the ways SGLang's do: fused along a dimension, stacked per expert, into a non-contiguous slice, by
item assignment; and one that transposes, which a sparse patch must refuse. (The real engine: the in-place
tests of tests/integration/weight_sync/test_weight_sync.py.) Every patch here is written by the agent's writer
(weight_patch.writer) and applied by the engine's loader: both ends of the format, round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from weight_patch import format as wp, loader as inplace_loader, writer as patch_writer


class Toy(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def param(*shape):  # bf16 values, upcast as a float32 replica holds a bf16 checkpoint (or kept bf16)
            return torch.nn.Parameter(torch.randn(*shape, generator=g).to(torch.bfloat16).to(dtype))

        self.qk = param(6, 4)  # q rows 0-2, k rows 3-5 (as qkv_proj)
        self.w13 = param(2, 3, 4)  # one slab per expert
        self.cols = param(3, 8)  # "c" lands in columns 2..5
        self.tr = param(4, 3)  # "t" is stored transposed

    def load_weights(self, named):
        for name, w in named:
            if name == "q":
                self.qk.data.narrow(0, 0, 3).copy_(w)
            elif name == "k":
                self.qk.data[3:6] = w
            elif name.startswith("e"):
                self.w13.data[int(name[1:])].copy_(w)
            elif name == "c":
                self.cols.data[:, 2:6].copy_(w)
            elif name == "t":
                self.tr.data.copy_(w.t())


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.bfloat16).view(torch.int16).numpy()


def _patch(path, sparse: dict, full: dict | None = None, shapes: dict | None = None) -> str:
    """sparse: name -> (base tensor, new bf16 tensor, positions changed); full: name -> new bf16 tensor;
    shapes: name -> (dtype, shape) the patch says instead (BF16 and the tensor's own). Written by the writer."""
    writer = patch_writer.PatchWriter()
    for name, (base, new, idx) in sparse.items():
        dtype, shape = (shapes or {}).get(name, ("BF16", list(new.shape)))
        idx = np.asarray(idx, patch_writer.index_dtype(new.numel()))
        base_bits = _bits(base).reshape(-1)
        writer.sparse(name, dtype, shape, idx, _bits(new).reshape(-1)[idx] ^ base_bits[idx], base_bits)
    for name, new in (full or {}).items():
        writer.whole(name, "BF16", list(new.shape), _bits(new))
    assert writer.write(path) == path.stat().st_size and len(writer) == len(sparse) + len(full or {})
    return str(path)


def _run(model, path) -> dict:
    inplace_loader.apply(model, [(wp.PATH_PREFIX + path, torch.zeros(1))])
    return wp.read_result(path)


def _new(t: torch.Tensor, positions, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = t.detach().clone().to(torch.bfloat16).reshape(-1)
    out[positions] = torch.randn(len(positions), generator=g).to(torch.bfloat16)
    return out.reshape(t.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_and_whole_tensors_land_where_the_models_loader_puts_them(tmp_path, dtype):
    model, expected = Toy(dtype), Toy(dtype)
    bases = {
        "q": model.qk.data[0:3].clone(),
        "k": model.qk.data[3:6].clone(),
        "e1": model.w13.data[1].clone(),
        "c": model.cols.data[:, 2:6].clone(),
    }
    q = _new(bases["q"], [0, 5, 11], 1)
    k = _new(bases["k"], [2], 2)
    e1 = _new(bases["e1"], [0, 7], 3)
    c = _new(bases["c"], [1, 4, 9, 10], 4)
    e0 = _new(model.w13.data[0], list(range(12)), 5)
    changes = {"q": (q, [0, 5, 11]), "k": (k, [2]), "e1": (e1, [0, 7]), "c": (c, [1, 4, 9, 10])}
    path = _patch(tmp_path / "p.safetensors", {n: (bases[n], new, idx) for n, (new, idx) in changes.items()})
    result = _run(model, path)
    assert result["ok"] and result["elements"] == 10 and result["probed"] == 4, result
    expected.load_weights([("q", q), ("k", k), ("e1", e1), ("c", c)])
    for a, b in zip(model.parameters(), expected.parameters(), strict=True):
        assert torch.equal(a, b)
    path = _patch(tmp_path / "full.safetensors", {}, {"e0": e0})
    assert _run(model, path)["ok"]
    assert torch.equal(model.w13.data[0], e0.to(dtype))


@pytest.mark.parametrize(
    "how",
    ["transposed", "unknown_tensor", "position_out_of_range", "not_the_base"],
)
def test_a_patch_that_does_not_fit_is_refused_and_writes_nothing(tmp_path, how):
    model = Toy()
    before = [p.detach().clone() for p in model.parameters()]
    q = _new(model.qk.data[0:3], [1], 1)
    sparse = {"q": (model.qk.data[0:3], q, [1])}  # fits; listed first, so a refusal must come before any write
    shapes = None
    if how == "transposed":
        t = model.tr.data.t().contiguous()
        sparse["t"] = (t, _new(t, [0], 2), [0])
    elif how == "unknown_tensor":
        sparse["nope"] = (torch.zeros(2, 2), torch.ones(2, 2), [0])
    elif how == "not_the_base":
        sparse["k"] = (model.qk.data[3:6] + 1, _new(model.qk.data[3:6], [0], 3), [0])
    else:
        sparse["k"] = (model.qk.data[3:6], _new(model.qk.data[3:6], [0], 3), [0])
    path = _patch(tmp_path / "p.safetensors", sparse, shapes=shapes)
    if how == "position_out_of_range":
        from safetensors.numpy import load_file

        arrays = load_file(path)
        arrays["k" + wp.IDX] = np.array([12], np.int32)  # k has 12 elements
        save_file(arrays, path, wp.encode_meta({"q": ("BF16", [3, 4]), "k": ("BF16", [3, 4])}))
    result = _run(model, path)
    assert not result["ok"] and result["error"] and result["written"] == 0
    for a, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(a, b)


def test_the_loader_never_raises_into_the_engine(tmp_path):
    model = Toy()
    inplace_loader.apply(model, [("q", torch.zeros(3, 4))])  # not a patch: logged, nothing done
    inplace_loader.apply(model, [(wp.PATH_PREFIX + "relative.safetensors", torch.zeros(1))])  # refused unread
    assert _run(model, str(tmp_path / "missing.safetensors"))["ok"] is False
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    assert _run(model, str(tmp_path / "junk.safetensors"))["ok"] is False
    inplace_loader.apply(model, [(wp.PATH_PREFIX + "/nonexistent-dir/p.safetensors", torch.zeros(1))])  # no outcome


def test_the_outcome_is_never_written_through_a_planted_link(tmp_path):
    model = Toy()
    q = _new(model.qk.data[0:3], [1], 1)
    path = _patch(tmp_path / "p.safetensors", {"q": (model.qk.data[0:3], q, [1])})
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "p.safetensors.result.tmp").symlink_to(victim)
    assert _run(model, path)["ok"]
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_patch_applies_once_and_only_to_its_base(tmp_path, dtype):
    """An XOR applied twice would give the base back under the new version's label: the second is refused,
    and the model keeps what the first made."""
    model = Toy(dtype)
    q = _new(model.qk.data[0:3], list(range(0, 12, 2)), 1)
    path = _patch(tmp_path / "p.safetensors", {"q": (model.qk.data[0:3].clone(), q, list(range(0, 12, 2)))})
    assert _run(model, path)["ok"]
    assert torch.equal(model.qk.data[0:3], q.to(dtype))
    again = _run(model, path)
    assert not again["ok"] and "does not hold the base" in again["error"] and again["written"] == 0
    assert torch.equal(model.qk.data[0:3], q.to(dtype))


def test_a_patch_of_a_dtype_without_an_exact_bit_relation_is_refused(tmp_path):
    model = Toy(torch.float32)
    base = model.qk.data[0:3].clone()
    q = _new(base, [1], 1)
    path = _patch(tmp_path / "p.safetensors", {"q": (base, q, [1])}, shapes={"q": ("F16", [3, 4])})
    result = _run(model, path)
    assert not result["ok"] and "float32" in result["error"] and result["written"] == 0
    assert torch.equal(model.qk.data[0:3], base)


class Aliased(Toy):
    """A loader that puts two checkpoint tensors in one place (tied weights), or one tensor twice."""

    def load_weights(self, named):
        for name, w in named:
            if name in ("q", "tied_q"):
                self.qk.data[0:3].copy_(w)
            elif name == "twice":
                self.qk.data[3:6].copy_(w)
                self.qk.data[3:6].copy_(w)
            else:
                super().load_weights([(name, w)])


@pytest.mark.parametrize("names", [("q", "tied_q"), ("twice",)])
def test_an_xor_that_would_be_written_twice_to_the_same_place_is_refused(tmp_path, names):
    model = Aliased()
    before = [p.detach().clone() for p in model.parameters()]
    place = model.qk.data[0:3] if names[0] == "q" else model.qk.data[3:6]
    sparse = {n: (place, _new(place, [1], i), [1]) for i, n in enumerate(names)}
    result = _run(model, _patch(tmp_path / "p.safetensors", sparse))
    assert not result["ok"] and "same memory" in result["error"] and result["written"] == 0, result
    for a, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(a, b)


def test_a_warm_up_patch_places_every_tensor_and_changes_nothing(tmp_path):
    model = Toy()
    before = [p.detach().clone() for p in model.parameters()]
    names = {"q": [3, 4], "k": [3, 4], "e0": [3, 4], "e1": [3, 4], "c": [3, 4]}
    specs = {n: ("BF16", s) for n, s in names.items()} | {"scale": ("I64", [1])}  # no patch form: left out
    path = str(patch_writer.warmup(specs, tmp_path / "warm" / "warm.safetensors"))
    result = _run(model, path)
    assert result["ok"] and result["probed"] == len(names) and result["elements"] == 0, result
    for a, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(a, b)
    q = _new(model.qk.data[0:3], [2], 1)
    again = _run(model, _patch(tmp_path / "p.safetensors", {"q": (model.qk.data[0:3].clone(), q, [2])}))
    assert again["ok"] and again["probed"] == 0 and torch.equal(model.qk.data[0:3], q.float())


def test_places_belong_to_their_model_and_go_with_it(tmp_path):
    """Two models in one process each place their own tensors, and a freed model's places go with it (keyed by
    id(), a model made at a freed one's address inherited its places: CI saw `probed` 0 for a fresh model)."""
    import gc

    first, second = Toy(), Toy()
    for model in (first, second):
        q = _new(model.qk.data[0:3], [2], 1)
        result = _run(model, _patch(tmp_path / f"{id(model)}.safetensors", {"q": (model.qk.data[0:3].clone(), q, [2])}))
        assert result["ok"] and result["probed"] == 1, result
    held = len(inplace_loader._places)
    assert first in inplace_loader._places and second in inplace_loader._places
    del first, model
    gc.collect()
    assert len(inplace_loader._places) == held - 1 and second in inplace_loader._places


class Wide(torch.nn.Module):
    """One tensor of 4096 elements, loaded as is: room for more changes than a patch carries base bits of."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(64, 64, generator=g).to(torch.bfloat16).to(dtype))

    def load_weights(self, named):
        for _, w in named:
            self.w.data.copy_(w)


def test_the_writers_patch_round_trips_through_the_loader_past_the_base_sample(tmp_path):
    """The writer's sparse entry (more changes than WAS_SAMPLE: it carries the base bits of the first few),
    then a whole one, applied by the loader: the model ends up holding each new tensor bit for bit, and the
    sparse patch applies once."""
    model = Wide()
    base = model.w.data.clone()
    positions = list(range(0, 4096, 41))  # 100 changes, under SPARSE_MAX_SHARE of 4096
    assert len(positions) > wp.WAS_SAMPLE and wp.travels_sparse(len(positions), base.numel())
    new = _new(base, positions, 7)
    path = _patch(tmp_path / "sparse.safetensors", {"w": (base, new, positions)})
    result = _run(model, path)
    assert result["ok"] and result["elements"] == len(positions), result
    assert torch.equal(model.w.data, new.float())
    assert not _run(model, path)["ok"] and torch.equal(model.w.data, new.float())
    whole = _new(new, list(range(4096)), 8)
    assert _run(model, _patch(tmp_path / "whole.safetensors", {}, {"w": whole}))["ok"]
    assert torch.equal(model.w.data, whole.float())
