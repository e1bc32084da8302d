"""How the trainer's model is spread over its ranks: `dp` keeps a whole copy (and optimizer state) on every
rank and sums gradients with one all-reduce (online_rl.trainer.update); `fsdp` shards parameters, gradients and
optimizer state over the ranks with torch's FSDP2 (`fully_shard`, one unit per decoder block, then the
root for the embedding, final norm and head), so a rank holds about 1/N of them and gathers one block at
a time. Gloo on CPU, NCCL on GPUs: the same calls.

Under FSDP every collective is entered by every rank in the same order, so the ranks must run the same
number of forwards (online_rl.trainer.update pads with a zero-weight forward), save and load checkpoints together
(torch.distributed.checkpoint, online_rl.trainer.checkpoints) and gather full tensors together to publish.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from online_rl.config import ShardConfig

if TYPE_CHECKING:
    from online_rl.model.transformer import MoECoder


def sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def compute_dtype(cfg: ShardConfig, device: torch.device) -> torch.dtype:
    if cfg.param_dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.param_dtype)


def shard(model: MoECoder, cfg: ShardConfig, device: torch.device | None = None) -> MoECoder:
    """FSDP2 over the default process group: each decoder block its own unit, then the root. In place;
    returns the model. Gradients are summed across ranks, not averaged: the loss already divides by the
    global number of sequences, as the dp path's all-reduce sums."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    device = device or torch.device("cpu")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dtype = compute_dtype(cfg, device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    # The root (embedding, final norm, head) is resharded after its forward too: FSDP2 keeps a root gathered
    # until its backward by default, and the KL reference never runs one, so it would stay whole for good.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    for unit in (m for m in model.modules() if isinstance(m, FSDPModule)):  # each unit's own setting
        unit.set_gradient_divide_factor(1.0)
        if dist.get_backend() == "gloo":  # gloo has no PREMUL_SUM: plain sums (a factor of 1 scales nothing)
            unit.set_force_sum_reduction_for_comms(True)
    return model


def load_sharded(path: Path, cfg: ShardConfig, device: torch.device | None = None) -> MoECoder:
    """A Hugging Face checkpoint straight into a sharded model: built on the meta device, sharded, then each
    rank copies its rows of each tensor as the checkpoint is read one tensor at a time. No rank ever holds
    the whole model (online_rl.model.transformer.load_pretrained would: a full fp32 copy, then its shard), so a rank's
    peak at start-up is its shard plus one tensor. Same checks and name mapping as load_pretrained."""
    from safetensors import safe_open

    from online_rl.model.transformer import ModelConfig, MoECoder, split_fused_experts

    device = device or torch.device("cpu")
    path = Path(path)
    mcfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):
        model = MoECoder(mcfg)
    shard(model, cfg, device)
    model.to_empty(device=device)
    params = dict(model.named_parameters())  # a tied head is the embedding: one entry
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"checkpoint {path} has no *.safetensors (only safetensors checkpoints load)")
    rank, world = dist.get_rank(), dist.get_world_size()
    done, unexpected = set(), []
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), "pt") as st:
                for key in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if key.endswith("rotary_emb.inv_freq") or (mcfg.tie_word_embeddings and key == "lm_head.weight"):
                        continue
                    for name, full in split_fused_experts({key: st.get_tensor(key)}, mcfg).items():
                        if name not in params:
                            unexpected.append(name)
                            continue
                        local = params[name].to_local()  # type: ignore[attr-defined]  # shard() made it a DTensor
                        chunks = torch.chunk(full, world, dim=0)  # FSDP2's dim-0 split
                        rows = chunks[rank] if rank < len(chunks) else full[:0]
                        if tuple(full.shape) != tuple(params[name].shape) or rows.shape != local.shape:
                            raise ValueError(
                                f"{name}: checkpoint shape {tuple(full.shape)}, model {tuple(params[name].shape)}"
                            )
                        local.copy_(rows)
                        done.add(name)
    missing = sorted(set(params) - done)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model


def full_tensors(model: torch.nn.Module, names=None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every state-dict entry, one at a time, under the Hugging Face names. A
    sharded entry is gathered from every rank (a collective: every rank iterates to the end, in this
    order); at most one gathered tensor is alive at a time if the caller drops each before the next."""
    for name, t in model.state_dict().items():
        if names is None or name in names:  # the same `names` on every rank
            yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def metadata(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Global shape and dtype of every state-dict entry, without gathering anything."""
    return {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}


def to_float(x) -> float:
    """A scalar a sharded computation returns (clip_grad_norm_ over DTensor grads gives a DTensor)."""
    if isinstance(x, DTensor):
        x = x.full_tensor()
    return float(x)
