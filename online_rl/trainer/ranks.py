"""The trainer's ranks (`flywheel train --nproc N`): rank 0 runs the loop and does all I/O; the others
follow it, doing what rank 0 tells them in the order it tells them, so that every collective is entered
by every rank in the same order:

    ("update", samples, advantages)   one optimizer step (online_rl.trainer.update)
    ("save", directory)               write this rank's shards of model and optimizer (FSDP only)
    ("export",)                       gather every full tensor to publish (FSDP only; rank 0 writes)
    ("stop",)                         leave

A rank that dies takes the run down (torch.multiprocessing.spawn ends the others); the next run resumes
from the last committed checkpoint, as after a kill -9 of one process.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
import torch.distributed as dist

from online_rl.trainer.update import update, world

if TYPE_CHECKING:
    from online_rl.config import TrainerConfig
    from online_rl.model.transformer import MoECoder

log = logging.getLogger(__name__)


class Ranked(Protocol):
    """What the ranks use of the trainer (online_rl.trainer.loop.Trainer, which the command line hands to
    run_distributed): rank 0 runs it; the others keep their model and optimizer in step with rank 0's."""

    model: MoECoder
    ref: MoECoder | None
    opt: torch.optim.Optimizer
    cfg: TrainerConfig
    step: int

    def run(self) -> None: ...


# The other ranks wait for their next command for as long as rank 0 has nothing to train (no traffic, the
# broker away, long rollouts): hours, where the default group's timeout (30 min gloo, 10 min NCCL) would end
# the run. Commands travel on a gloo group of their own with no practical timeout (and, under NCCL, pickled
# samples then never go through a GPU); the collectives of the work itself keep the default group's.
COMMAND_TIMEOUT = timedelta(days=365)
_group = None


def _command_group():
    global _group
    if _group is None:  # created at the first command, which every rank reaches at the same point
        _group = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    return _group


def command(cmd: tuple | None = None) -> tuple:
    """Rank 0 sends `cmd` to every rank; every rank returns it (one process: returned as is)."""
    rank, size = world()
    if size == 1:
        assert cmd is not None, "rank 0 sends one"
        return cmd
    box: list[Any] = [cmd if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=_command_group())
    return box[0]


# ---------------------------------------------------------------------- sharded checkpoints (FSDP)
SHARDS = "shards"  # the directory of a checkpoint holding the model's and optimizer's shards


def save_shards(model: torch.nn.Module, opt: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank writes its shards (torch.distributed.checkpoint, files fsynced); collective. A failure
    on any rank raises on every rank, as an OSError (so that the trainer's checkpoint retry takes it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    try:
        dcp.save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(str(directory), sync_files=True))
    except dcp.api.CheckpointException as e:  # a BaseException: it would pass through every `except Exception`
        raise OSError(f"sharded checkpoint {directory} not written: {e}") from None


def load_shards(model: torch.nn.Module, opt: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank reads its shards of `directory` (saved on any number of ranks: DCP reshards); collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(directory)))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


# ---------------------------------------------------------------------- the other ranks
def worker_loop(trainer: Ranked) -> None:
    """Ranks > 0: take part in what rank 0 starts, until it says stop."""
    from online_rl.trainer.export import gather_for_export

    while True:
        cmd = command()
        if cmd[0] == "stop":
            return
        if cmd[0] == "update":
            _, samples, adv = cmd
            update(trainer.model, trainer.ref, trainer.opt, samples, adv, trainer.cfg.loss, trainer.cfg.optim)
            trainer.step += 1
        elif cmd[0] == "save":
            try:
                save_shards(trainer.model, trainer.opt, Path(cmd[1]))
            except OSError as e:  # rank 0 reports it and retries; this rank waits for its next command
                log.warning("%s", e)
        elif cmd[0] == "export":
            gather_for_export(trainer.model)
        else:
            raise ValueError(f"unknown command {cmd[0]!r} from rank 0")


def _rank_main(rank: int, size: int, port: int, cfg: TrainerConfig, make: Callable[[TrainerConfig], Ranked]) -> None:
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    global _group
    try:
        trainer = make(cfg)
        if rank == 0:
            trainer.run()
        else:
            worker_loop(trainer)
    finally:
        _group = None
        dist.destroy_process_group()


def run_distributed(cfg: TrainerConfig, nproc: int, make: Callable[[TrainerConfig], Ranked]) -> None:
    """`flywheel train --nproc N`: N ranks on this machine (FSDP needs a process group, even of one), each
    with the trainer `make` builds (the Trainer class: pickled by name into each rank)."""
    from infra.procs import free_port

    if nproc <= 1 and cfg.sharding.shard == "dp":
        make(cfg).run()
        return
    spawn(_rank_main, (max(1, nproc), free_port(), cfg, make), max(1, nproc))


# glibc raises its mmap threshold after each large free (up to 32 MiB), after which tensor-sized blocks come
# from the heap, whose freed memory a process keeps: a rank whose tensors come and go (FSDP gathers a block,
# frees it, gathers the next) then holds its high-water mark for good. A fixed threshold keeps every block
# of 1 MiB or more its own mapping, returned when freed. Measured (benchmarks.trainer, ~290M parameters,
# 2 FSDP ranks): peak RSS per rank 5.5 GB without, 4.3 GB with, against 3.6 GB of live tensors.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def spawn(fn, args: tuple, nprocs: int) -> None:
    """torch.multiprocessing.spawn of `nprocs` ranks, with the allocator settings above (read by glibc at
    process start, so set for the children only: this process's own allocator is already running)."""
    import os

    import torch.multiprocessing as mp

    saved = {k: os.environ.get(k) for k in MALLOC_ENV}
    os.environ.update({k: os.environ.get(k) or v for k, v in MALLOC_ENV.items()})
    try:
        mp.spawn(fn, args=args, nprocs=nprocs, join=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
