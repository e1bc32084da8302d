"""SGLang custom weight loader (`--custom-weight-loader serving.inplace_loader.apply`): apply a weight patch
(flywheel.core.weight_patch) to the served model in place, element by element where few changed.

A whole tensor goes through the model's own `load_weights`, as SGLang's stock path would. A sparse one
(positions and values) must land in the model's parameters, which SGLang fuses and reshapes (q/k/v into
one qkv_proj, the experts' gate/up into w13). Rather than re-implement that mapping per architecture, the
model's own loader is asked once per tensor name: it is handed a probe tensor whose elements hold their
own positions, and the copy it makes is intercepted, not done. If the copy's source is exactly the probe
(same shape, every element where it started), the destination view is where that tensor lives; the view
is kept as (parameter name, offset, shape, strides), so a parameter SGLang re-creates later is found again.
A loader that transforms the tensor (transposes, splits it over ranks) fails the check, and the patch is
refused: the agent then reloads the whole checkpoint from disk, which repairs anything a failed patch did.
"""

from __future__ import annotations

import logging

import torch
from safetensors import safe_open

from flywheel.core import weight_patch as wp

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_places: dict[tuple[int, str], list[tuple[str, int, tuple, tuple]]] = {}  # (id(model), name) -> targets


class PatchError(RuntimeError):
    pass


class _Probe(torch.Tensor):
    """A checkpoint tensor's stand-in during one `load_weights` call: copies from it are recorded, not done."""

    sink: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_ and len(args) >= 2 and isinstance(args[1], _Probe):
            if isinstance(args[0], _Probe):
                raise PatchError("the loader copies into the checkpoint tensor itself")
            cls.sink.append((args[0], args[1]))
            return args[0]
        if func is torch.Tensor.__setitem__ and len(args) == 3 and isinstance(args[2], _Probe):
            with torch._C.DisableTorchFunctionSubclass():
                dst = args[0][args[1]]
            cls.sink.append((dst, args[2]))
            return None
        return super().__torch_function__(func, types, args, kwargs)


def _owners(model) -> dict[int, str]:
    out = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        out.setdefault(t.untyped_storage().data_ptr(), name)
    return out


def _tensors(model) -> dict[str, torch.Tensor]:
    return {**dict(model.named_buffers()), **dict(model.named_parameters())}


def _probe(model, name: str, shape: list[int]) -> list[tuple[str, int, tuple, tuple]]:
    n = 1
    for s in shape:
        n *= s
    dtype = torch.float32 if n <= 2**24 else torch.float64  # every position exact
    probe = torch.arange(n, dtype=dtype).view(shape).as_subclass(_Probe)
    _Probe.sink = []
    try:
        model.load_weights([(name, probe)])
    finally:
        sink, _Probe.sink = _Probe.sink, []
    owners, targets = _owners(model), []
    for dst, src in sink:
        src = src.as_subclass(torch.Tensor)
        if tuple(src.shape) != tuple(shape) or tuple(dst.shape) != tuple(shape):
            raise PatchError(f"{name}: the loader reshapes it ({list(src.shape)} -> {list(dst.shape)})")
        if not torch.equal(src.to(torch.float64).flatten(), torch.arange(n, dtype=torch.float64)):
            raise PatchError(f"{name}: the loader rearranges its elements")
        owner = owners.get(dst.untyped_storage().data_ptr())
        if owner is None:
            raise PatchError(f"{name}: the loader copies it somewhere that is not a parameter")
        targets.append((owner, dst.storage_offset(), tuple(dst.shape), tuple(dst.stride())))
    if not targets:
        raise PatchError(f"{name}: the loader puts it nowhere this loader can see")
    for t in _tensors(model).values():
        if isinstance(t, _Probe):
            raise PatchError(f"{name}: the loader keeps the checkpoint tensor itself")
    return targets


def _views(model, name: str, shape: list[int]) -> list[torch.Tensor]:
    key = (id(model), name)
    if key not in _places:
        _places[key] = _probe(model, name, shape)
    tensors, views = _tensors(model), []
    for owner, offset, vshape, stride in _places[key]:
        base = tensors[owner].data
        views.append(base.as_strided(vshape, stride, offset))
    return views


def _bits_as(t: torch.Tensor, dtype: str) -> torch.Tensor:
    return t.view(_TORCH_DTYPES[dtype])


def _apply(model, path: str) -> int:
    """Check the whole patch against the model, then write it. Returns the elements written."""
    with safe_open(path, framework="pt") as f:
        specs, keys = wp.decode_meta(f.metadata()), set(f.keys())
        plan = []
        for name, (dtype, shape) in specs.items():  # nothing is written until every tensor has its place
            numel = 1
            for s in shape:
                numel *= s
            views = _views(model, name, shape)
            if name in keys:
                full = _bits_as(f.get_tensor(name), dtype)
                if list(full.shape) != list(shape):
                    raise PatchError(f"{name}: {list(full.shape)} in the patch, {shape} in its metadata")
                plan.append((views, None, full))
                continue
            idx, vals = f.get_tensor(name + wp.IDX).long(), _bits_as(f.get_tensor(name + wp.VAL), dtype)
            if idx.shape != vals.shape or idx.ndim != 1 or (idx.numel() and (idx.min() < 0 or idx.max() >= numel)):
                raise PatchError(f"{name}: positions and values do not fit a tensor of {numel}")
            plan.append((views, idx, vals))
    written = 0
    for views, idx, vals in plan:
        for view in views:
            v = vals.to(device=view.device, dtype=view.dtype)
            if idx is None:
                view.copy_(v)
            elif view.is_contiguous():
                view.view(-1)[idx.to(view.device)] = v
            else:
                view[torch.unravel_index(idx.to(view.device), tuple(view.shape))] = v
        written += vals.numel()
    return written


def apply(model, named_tensors) -> None:
    """SGLang's custom-loader entry point: `named_tensors` holds one tensor named PATH_PREFIX + the patch file.
    Never raises: an exception here would stop SGLang's scheduler. The outcome goes to <patch>.result (JSON),
    which the agent reads; a refused patch has written nothing."""
    paths = [n[len(wp.PATH_PREFIX) :] for n, _ in named_tensors if n.startswith(wp.PATH_PREFIX)]
    if len(paths) != 1 or len(named_tensors) != 1:
        log.error(
            "weight patch: expected one %s<path> entry, got %s", wp.PATH_PREFIX, [n for n, _ in named_tensors][:3]
        )
        return
    try:
        result = {"ok": True, "elements": _apply(model, paths[0])}
    except Exception as e:  # reported to the agent, which reloads from disk
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    (log.info if result["ok"] else log.error)("weight patch %s: %s", paths[0], result)
    wp.write_result(paths[0], result)
