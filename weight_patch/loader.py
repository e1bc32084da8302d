"""SGLang custom weight loader (`--custom-weight-loader weight_patch.loader.apply`): apply a weight patch
(weight_patch.format) to the served model in place, element by element where few changed: their
XOR with the base, applied only where the model holds the base bits the patch names (so never to another
version, never twice), with a fused loop on a CPU (kernels.delta.xor_scatter), tensors side by side.

A patch's tensors (whole, or positions and XORs) must land in the model's parameters, which SGLang fuses
and reshapes (q/k/v into one qkv_proj, the experts' gate/up into w13). Rather than re-implement that
mapping per architecture, the model's own loader is asked, once for every name a patch brings: it is
handed probe tensors (allocated, never read or written) and the copies it makes are intercepted, not done.
If a copy's source is exactly its probe (same storage, offset, shape and strides), the destination view is
where that tensor lives; it is kept as (parameter name, offset, shape, strides), so a parameter SGLang
re-creates later is found again. A loader that transforms a tensor (transposes it, splits it over ranks,
writes it by other means than a copy) fails the check, and the patch is refused before anything is written:
the agent then reloads the whole checkpoint from disk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from safetensors import safe_open

from kernels import delta as delta_kernels
from weight_patch import format as wp

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# model -> name -> targets. Weak, by the model itself: keyed by id(model), a model freed and another made at the
# same address would inherit the first one's places (seen in CI: two models in one process, the second "known").
_places: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PatchError(RuntimeError):
    pass


class _Probe(torch.Tensor):
    """A checkpoint tensor's stand-in during `load_weights`: whatever would write it into another tensor is
    recorded instead of done."""

    sink: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is torch.Tensor.__setitem__ and len(args) == 3 and isinstance(args[2], _Probe):
            with torch._C.DisableTorchFunctionSubclass():
                dst = args[0][args[1]]
            cls.sink.append((dst, args[2]))
            return None
        if name.endswith("_") and args and not isinstance(args[0], _Probe):
            srcs = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, _Probe)]
            if srcs:  # copy_ is the one understood; any other in-place write is recorded as unplaceable
                cls.sink.append((args[0] if func is torch.Tensor.copy_ else None, srcs[0]))
                return args[0]
        return super().__torch_function__(func, types, args, kwargs)


def _owners(model) -> dict[int, str]:
    out: dict[int, str] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        out.setdefault(t.untyped_storage().data_ptr(), name)
    return out


def _tensors(model) -> dict[str, torch.Tensor]:
    return {**dict(model.named_buffers()), **dict(model.named_parameters())}


def _probe(model, specs: dict[str, tuple[str, list[int]]]) -> dict[str, list[tuple[str, int, tuple, tuple]]]:
    """Where the model's own loader puts each named tensor, asked in one `load_weights` call. A probe (of the
    checkpoint's dtype, on the CPU as a checkpoint's tensors are) is placed only if the loader copies the
    probe itself, unchanged (same storage, offset, shape and strides), into a view of one parameter;
    anything else raises PatchError."""
    probes = {n: torch.empty(s, dtype=_TORCH_DTYPES[d]).as_subclass(_Probe) for n, (d, s) in specs.items()}
    shapes = {n: s for n, (_, s) in specs.items()}
    by_storage = {p.untyped_storage().data_ptr(): n for n, p in probes.items() if p.numel()}
    _Probe.sink = []
    try:
        model.load_weights(list(probes.items()))
    finally:
        sink, _Probe.sink = _Probe.sink, []
    owners = _owners(model)
    places: dict[str, list] = {n: [] for n in shapes}
    for dst, src in sink:
        name = by_storage.get(src.untyped_storage().data_ptr())
        if name is None:
            raise PatchError("the loader copies from a tensor it made, not from the checkpoint's")
        probe = probes[name]
        if dst is None:
            raise PatchError(f"{name}: the loader writes it by an operation other than a copy")
        same = (src.data_ptr(), tuple(src.shape), src.stride()) == (
            probe.data_ptr(),
            tuple(probe.shape),
            probe.stride(),
        )
        if not same or tuple(dst.shape) != tuple(probe.shape):
            raise PatchError(f"{name}: the loader transforms it ({list(src.shape)} -> {list(dst.shape)})")
        owner = owners.get(dst.untyped_storage().data_ptr())
        if owner is None:
            raise PatchError(f"{name}: the loader copies it somewhere that is not a parameter")
        places[name].append((owner, dst.storage_offset(), tuple(dst.shape), tuple(dst.stride())))
    for name, targets in places.items():
        if not targets and probes[name].numel():
            raise PatchError(f"{name}: the loader puts it nowhere this loader can see")
    for t in _tensors(model).values():
        if isinstance(t, _Probe):
            raise PatchError("the loader keeps a checkpoint tensor itself")
    return places


def _views(model, specs: dict[str, tuple[str, list[int]]]) -> dict[str, list[torch.Tensor]]:
    """Each patched tensor's views into the model's parameters (placed once per model, then remembered)."""
    known = _places.setdefault(model, {})
    unknown = {n: spec for n, spec in specs.items() if n not in known}
    if unknown:
        known.update(_probe(model, unknown))
    tensors, views = _tensors(model), {}
    for name in specs:
        views[name] = [
            tensors[owner].data.as_strided(vshape, stride, offset) for owner, offset, vshape, stride in known[name]
        ]
    return views


def _bits_as(t: torch.Tensor, dtype: str) -> torch.Tensor:
    return t.view(_TORCH_DTYPES[dtype])


_SIGNED = {2: torch.int16, 4: torch.int32}
_NUMPY_UNSIGNED = {2: np.uint16, 4: np.uint32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as signed integers of its width, any layout (torch computes on those)."""
    return t.view(_SIGNED[t.element_size()])


def _unsigned(t: torch.Tensor) -> torch.Tensor:
    """Bits (a signed integer tensor) as their unsigned values, in int64."""
    return t.to(torch.int64) & ((1 << 8 * t.element_size()) - 1)


def _shift(view: torch.Tensor, dtype: str) -> int:
    """Where a `dtype` XOR goes in the bits of the parameter `view`: 0 for the same dtype, 16 for bf16 held as
    float32 (an upcast bf16 is its bits and 16 zeros). Any other pair has no exact bit relation: refused,
    and the agent reloads from disk."""
    if view.dtype == _TORCH_DTYPES[dtype]:
        return 0
    if dtype == "BF16" and view.dtype == torch.float32:
        return 16
    raise PatchError(f"the model holds {view.dtype}, a {dtype} patch applies to {dtype} or bf16 as float32 only")


def _elements(view: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The bits of `view` (any layout) and the index that picks its flat positions `idx` in them."""
    bits, idx = _bits(view), idx.to(view.device).long()
    if view.is_contiguous():
        return bits.view(-1), (idx,)
    return bits, torch.unravel_index(idx, tuple(view.shape))


def _holds(view: torch.Tensor, idx: torch.Tensor, was: torch.Tensor, shift: int) -> bool:
    """Whether the model holds the base bits `was` at the first positions of `idx`."""
    if view.device.type == "cpu" and view.is_contiguous():  # numpy: a few µs a tensor, torch's ops ~10x that
        here = _bits(view).view(-1).numpy()[idx[: was.numel()].numpy()].astype(np.int64)
        here &= (1 << 8 * view.element_size()) - 1
        return bool(np.array_equal(here, _unsigned(_bits(was)).numpy() << shift))
    bits, at = _elements(view, idx[: was.numel()])
    return torch.equal(_unsigned(bits[at].cpu()), _unsigned(_bits(was)) << shift)


def _xor_scatter(view: torch.Tensor, idx: torch.Tensor, xor: torch.Tensor, shift: int) -> None:
    """view's flat elements at idx ^= xor << shift (bits). On a CPU, a fused loop (kernels.delta) over the
    parameter's memory; elsewhere torch's indexing."""
    xor = _bits(xor)
    if view.device.type == "cpu" and view.is_contiguous():
        target = _bits(view).view(-1).numpy().view(_NUMPY_UNSIGNED[view.element_size()])
        delta_kernels.xor_scatter(target, idx.numpy(), xor.numpy().view(_NUMPY_UNSIGNED[xor.element_size()]), shift)
        return
    bits, at = _elements(view, idx)
    x = _unsigned(xor.to(view.device)) << shift
    top = 1 << (8 * view.element_size() - 1)
    bits[at] = bits[at] ^ torch.where(x >= top, x - 2 * top, x).to(bits.dtype)  # the same bits, signed


def _write(targets: list[tuple[torch.Tensor, int]], idx: torch.Tensor | None, data: torch.Tensor, done: dict) -> int:
    with torch.no_grad():
        for view, shift in targets:
            if idx is None:
                view.copy_(data)
            else:
                _xor_scatter(view, idx, data, shift)
    with done["lock"]:
        done["written"] += 1
    return data.numel()


def _extent(view: torch.Tensor) -> tuple[int, int, int]:
    """(storage, first byte, one past the last byte) a view can touch."""
    size = view.element_size()
    last = sum((n - 1) * st for n, st in zip(view.shape, view.stride())) if view.numel() else -1
    start = view.storage_offset() * size
    return view.untyped_storage().data_ptr(), int(start), int(start + (last + 1) * size)


def _disjoint(plan: list) -> None:
    """An XOR written twice to the same element cancels (the replica would serve the base under the new
    label): refuse a target named twice, or places of XOR-patched tensors that overlap (tied weights), before
    anything is written. Conservative: views whose extents interleave are refused too."""
    spans = sorted(
        (*_extent(view), name)
        for name, targets, idx, _ in plan
        if idx is not None and idx.numel()
        for view, _ in targets
    )
    for (s1, _, end1, n1), (s2, start2, _, n2) in zip(spans, spans[1:]):
        if s1 == s2 and start2 < end1:
            raise PatchError(f"{n1} and {n2} land on the same memory: an XOR there would be written twice")


def _apply(model, path: str, done: dict) -> dict:
    """Check the whole patch against the model, then write it. Returns what it did and the time it took;
    `done["written"]` counts the tensors written so far (a failure while writing leaves some)."""
    t0, known = time.perf_counter(), len(_places.get(model, ()))
    with safe_open(path, framework="pt") as f:
        specs, keys = wp.decode_meta(f.metadata()), set(f.keys())
        views = _views(model, specs)  # nothing is written until every tensor has its place
        plan = []
        for name, (dtype, shape) in specs.items():
            numel = 1
            for s in shape:
                numel *= s
            if name in keys:
                full = _bits_as(f.get_tensor(name), dtype)
                if list(full.shape) != list(shape):
                    raise PatchError(f"{name}: {list(full.shape)} in the patch, {shape} in its metadata")
                plan.append((name, [(v, 0) for v in views[name]], None, full))
                continue
            idx = f.get_tensor(name + wp.IDX)
            xor, was = _bits_as(f.get_tensor(name + wp.XOR), dtype), _bits_as(f.get_tensor(name + wp.WAS), dtype)
            if idx.shape != xor.shape or idx.ndim != 1 or (idx.numel() and (idx.min() < 0 or idx.max() >= numel)):
                raise PatchError(f"{name}: positions and values do not fit a tensor of {numel}")
            if was.shape != (min(wp.WAS_SAMPLE, idx.numel()),):
                raise PatchError(f"{name}: {tuple(was.shape)} base bits for {idx.numel()} positions")
            targets = [(view, _shift(view, dtype)) for view in views[name]]
            if not all(_holds(view, idx, was, shift) for view, shift in targets):
                raise PatchError(f"{name}: the model does not hold the base this patch applies to (applied twice?)")
            plan.append((name, targets, idx, xor))
        _disjoint(plan)
    t1, written = time.perf_counter(), 0
    # Tensors side by side (the CPU loop releases the GIL; the scheduler does nothing else meanwhile).
    with ThreadPoolExecutor(_threads()) as pool:
        for n in pool.map(lambda p: _write(p[1], p[2], p[3], done), plan):
            written += n
    return {
        "elements": written,
        "probed": len(_places.get(model, ())) - known,  # tensors placed for the first time (then remembered)
        "check_s": round(t1 - t0, 3),
        "write_s": round(time.perf_counter() - t1, 3),
    }


def _threads() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0))))


def apply(model, named_tensors) -> None:
    """SGLang's custom-loader entry point: `named_tensors` holds one tensor named PATH_PREFIX + the patch file.
    Never raises: an exception here would stop SGLang's scheduler. The outcome goes to <patch>.result (JSON),
    which the agent reads: `written` says how many tensors a refused patch changed (0 unless writing itself
    failed, since every check comes first)."""
    paths = [n[len(wp.PATH_PREFIX) :] for n, _ in named_tensors if n.startswith(wp.PATH_PREFIX)]
    if len(paths) != 1 or len(named_tensors) != 1 or not wp.valid_path(paths[0]):
        log.error("weight patch: expected one %s<absolute path>.safetensors, got %s", wp.PATH_PREFIX, paths[:1])
        return
    done = {"written": 0, "lock": threading.Lock()}
    try:
        result = {"ok": True, **_apply(model, paths[0], done)}
    except Exception as e:  # reported to the agent, which reloads from disk
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    result["written"] = done["written"]
    (log.info if result["ok"] else log.error)("weight patch %s: %s", paths[0], result)
    try:
        wp.write_result(paths[0], result)
    except Exception:  # the agent then finds no outcome and takes the patch as refused
        log.exception("weight patch %s: could not write its outcome", paths[0])
