"""The trainer sharded with FSDP2 over 2 real gloo ranks (separate processes): its update is the 1-rank
update; its checkpoints are every rank's shards, resumable on another number of ranks; what it publishes
is every full tensor gathered, byte for byte the same whichever ranks hold it.

(The exactly-once kill test under FSDP is in test_trainer.py, beside the one it repeats.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig, OptimConfig, PublisherConfig, ShardConfig, TrainerConfig
from online_rl.model.transformer import load_pretrained
from online_rl.trainer.loss import advantages
from tests.helpers import served_samples

pytestmark = pytest.mark.timeout(600)

LR = 1e-3
STEPS = 3


def _init(rank: int, size: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.set_num_threads(1)


def _steps(rank, size, port, model_dir, samples, adv, out, fsdp: bool, epochs: int = 1, own: bool = False) -> None:
    """STEPS updates of the test model (router replay and the KL on; `epochs` passes each, and the distillation in
    a step of its own if `own`); rank 0 saves the full weights."""
    import torch.distributed as dist

    from online_rl.trainer.sharding import full_tensors, load_sharded
    from online_rl.trainer.update import make_optimizer, update

    if fsdp:
        _init(rank, size, port)
    else:
        torch.set_num_threads(1)
    if fsdp:  # each rank reads its rows of the checkpoint (the 1-rank run: load_pretrained, the whole model)
        model, ref = (load_sharded(Path(model_dir), ShardConfig(shard="fsdp")) for _ in range(2))
        ref.eval()
    else:
        model, ref = load_pretrained(Path(model_dir)), load_pretrained(Path(model_dir)).eval()
    opt = make_optimizer(model, OptimConfig(lr=LR))
    norms = []
    for _ in range(STEPS):
        loss, optim = LossConfig(kl_coef=0.05, distill_step=own), OptimConfig(lr=LR, micro_batch=4, epochs=epochs)
        m = update(model, ref, opt, samples, adv, loss, optim)
        norms += [m["grad_norm"], m.get("grad_norm_last", 0.0), m.get("grad_norm_distill", 0.0)]
    full = dict(full_tensors(model))  # collective under FSDP: every rank gathers
    if rank == 0:
        torch.save({"weights": full, "grad_norms": norms}, out)
    if fsdp:
        dist.destroy_process_group()


@pytest.mark.parametrize("epochs, own", [(1, False), (2, True)], ids=["one-pass", "two-passes-and-distill-step"])
def test_two_fsdp_ranks_make_the_one_rank_update(test_model, tmp_path, epochs, own):
    import torch.multiprocessing as mp

    from infra.procs import free_port

    samples = served_samples(test_model, 9)  # odd: one rank has a micro-batch less and pads with a zero-weight pass
    for s in samples[::4]:  # users' comments: every micro-batch on every rank runs the teacher's forward too
        s.hint_ids = np.array([11, 12, 13], np.int64)
    adv, _ = advantages(samples, LossConfig(), 0.0)
    _steps(0, 1, 0, str(test_model), samples, adv, str(tmp_path / "one.pt"), False, epochs, own)
    args = (2, free_port(), str(test_model), samples, adv, str(tmp_path / "two.pt"), True, epochs, own)
    mp.spawn(_steps, args=args, nprocs=2)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    # The gradient itself, before clipping: AdamW (it divides by sqrt(v)) and the clip would hide a wrong
    # scale (averaged instead of summed across ranks) in the weights.
    # Only the first norm is taken at the same weights; every later pass (a second epoch, the distillation's own
    # step, the next steps) starts from weights that differ by Adam's eps-regime noise (below), measured moving
    # a norm by 1.0e-5 relative: still 4 orders below a factor of 2.
    norms = one["grad_norms"], two["grad_norms"]
    assert np.isclose(norms[0][0], norms[1][0], rtol=1e-5, atol=0), norms
    assert np.allclose(*norms, rtol=1e-4, atol=0), norms
    one, two = one["weights"], two["weights"]
    base = load_pretrained(test_model).state_dict()
    assert one.keys() == two.keys() == base.keys()
    moved = max((one[k] - base[k]).abs().max().item() for k in one)
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    assert moved > STEPS * LR * 0.9, "every step moved the weights (AdamW: about lr a step)"
    # Summation order differs (reduce-scatter vs one process), and AdamW divides by sqrt(v): measured 3.4e-6.
    assert diff < 0.01 * moved, f"2 FSDP ranks differ from 1 rank by {diff} (update size {moved})"


def _trainer_rank(rank, size, port, model_dir, work, samples, out, store=None) -> None:
    """A real Trainer on `size` FSDP ranks: rank 0 runs the loop's parts, the others follow its commands.
    With a store, rank 0 publishes through the trainer's own path (the other ranks gather with it)."""
    import torch.distributed as dist

    from online_rl.trainer.export import save_streaming
    from online_rl.trainer.loop import Trainer
    from online_rl.trainer.ranks import command, worker_loop

    _init(rank, size, port)
    cfg = TrainerConfig(
        model_dir=Path(model_dir),
        work_dir=Path(work),
        min_batch=1,
        batch_size=8,
        optim=OptimConfig(lr=LR, micro_batch=4),
        sharding=ShardConfig(shard="fsdp"),
        publish=PublisherConfig(store=Path(store), key=Path(store).parent / "k.pem") if store else PublisherConfig(),
    )
    trainer = Trainer(cfg)
    if rank == 0:
        info = {"resumed_step": trainer.step, "resumed_buffer": len(trainer.buffer)}
        if samples:
            trainer.buffer = list(samples)
            while trainer.buffer:
                assert trainer.train_step(force=True) is not None
            trainer.save()
        if store:
            info["version"] = trainer.publish()
        command(("export",))
        save_streaming(trainer.model, Path(out))
        info["step"] = trainer.step
        torch.save(info, Path(out) / "info.pt")
        command(("stop",))
    else:
        worker_loop(trainer)
    dist.destroy_process_group()


def test_fsdp_checkpoint_resumes_on_fewer_ranks_publishes_and_exports_the_same_bytes(test_model, tmp_path):
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    from infra.procs import free_port
    from weight_sync.manifest import generate_key
    from weight_sync.store.server import Store

    samples = served_samples(test_model, 12)
    work = str(tmp_path / "trainer")
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    store = tmp_path / "store"
    mp.spawn(
        _trainer_rank,
        args=(2, free_port(), str(test_model), work, samples, str(tmp_path / "two"), str(store)),
        nprocs=2,
    )
    ckpt = sorted((tmp_path / "trainer" / "checkpoints").glob("step-*"))[-1]
    assert sorted(p.name for p in ckpt.iterdir()) == ["shards", "trainer.pt"]
    assert "model" not in torch.load(ckpt / "trainer.pt", weights_only=True)  # the weights are in the shards
    assert len(list((ckpt / "shards").glob("*.distcp"))) == 2  # one file per rank
    two = torch.load(tmp_path / "two" / "info.pt")
    assert two == {"resumed_step": 0, "resumed_buffer": 0, "step": 2, "version": 1}  # 12 samples, batches of 8
    assert Store(store).versions() == [0, 1]  # v0 the base, v1 what the 2 ranks trained, published by rank 0
    published = (tmp_path / "trainer" / "published" / "step-00000002" / "model.safetensors").read_bytes()
    assert published == (tmp_path / "two" / "model.safetensors").read_bytes()

    mp.spawn(_trainer_rank, args=(1, free_port(), str(test_model), work, [], str(tmp_path / "one")), nprocs=1)
    one = torch.load(tmp_path / "one" / "info.pt")
    assert one == {"resumed_step": 2, "resumed_buffer": 0, "step": 2}
    a = (tmp_path / "two" / "model.safetensors").read_bytes()
    b = (tmp_path / "one" / "model.safetensors").read_bytes()
    assert a == b, "the weights resumed on 1 rank are not the weights 2 ranks saved"
    exported, base = load_file(tmp_path / "two" / "model.safetensors"), load_pretrained(test_model).state_dict()
    assert exported.keys() == base.keys() and all(t.dtype == torch.bfloat16 for t in exported.values())
    assert max((exported[k].float() - base[k]).abs().max().item() for k in base) > 0  # trained, not the base


def _load_rank(rank, size, port, paths: dict, out: str) -> None:
    import torch.distributed as dist

    from online_rl.trainer.sharding import full_tensors, load_sharded

    _init(rank, size, port)
    gathered = {arch: dict(full_tensors(load_sharded(Path(p), ShardConfig(shard="fsdp")))) for arch, p in paths.items()}
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


def test_sharded_load_of_transformers_checkpoints_is_the_whole_load(tmp_path):
    """Each rank reads its rows of Qwen3-MoE (per-expert and fused), dense tied Qwen3 and Llama checkpoints
    written by transformers: gathered, they are exactly what load_pretrained reads on one process."""
    import torch.multiprocessing as mp

    from infra.procs import free_port
    from tests.unit.online_rl.model.test_model_architectures import ARCHS, build

    paths = {}
    for arch in ARCHS:
        paths[arch] = tmp_path / arch
        build(arch, paths[arch])
    paths["qwen3_moe_fused"] = tmp_path / "fused"
    build("qwen3_moe", paths["qwen3_moe_fused"], fused=True)
    mp.spawn(_load_rank, args=(2, free_port(), {k: str(v) for k, v in paths.items()}, str(tmp_path / "g.pt")), nprocs=2)
    gathered = torch.load(tmp_path / "g.pt")
    for arch, path in paths.items():
        whole = load_pretrained(path).state_dict()
        assert gathered[arch].keys() == whole.keys(), arch
        assert all(torch.equal(gathered[arch][k], whole[k]) for k in whole), arch


def _idle_rank(rank, size, port, wait_s: float, out: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from online_rl.trainer.ranks import command

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=timedelta(seconds=2)
    )
    command(("noop",)) if rank == 0 else command()  # the command group exists on both ranks
    if rank == 0:
        import time

        time.sleep(wait_s)  # nothing to train for longer than the default group's timeout
        got = command(("stop",))
    else:
        got = command()
        Path(out).write_text(repr(got))
    dist.destroy_process_group()


def test_ranks_wait_for_commands_longer_than_the_collective_timeout(tmp_path):
    """A rank waits for rank 0's next command however long rank 0 has nothing to send: with the default
    group's timeout at 2 s here (30 min in production), a 6 s silence does not end the run."""
    import torch.multiprocessing as mp

    from infra.procs import free_port

    mp.spawn(_idle_rank, args=(2, free_port(), 6.0, str(tmp_path / "got")), nprocs=2)
    assert (tmp_path / "got").read_text() == "('stop',)"
