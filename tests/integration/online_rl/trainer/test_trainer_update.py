"""The trainer's update and checkpoints on their own (no broker): 2 data-parallel ranks make the 1-rank update,
stale samples are dropped, a failing pass or distillation costs only what it must, batch-invariant logprobs, and
checkpoints that round-trip as plain state, commit durably and refuse what they cannot trust. (Against a broker:
tests/integration/online_rl/trainer/test_trainer.py.)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig, OptimConfig, TrainerConfig
from online_rl.data.samples import Sample
from online_rl.data.simulate import heldout_split, sample_completions
from online_rl.model.transformer import load_pretrained
from online_rl.trainer.loop import Trainer
from online_rl.trainer.loss import advantages

pytestmark = pytest.mark.timeout(900)


def _tok(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _one_update(rank: int, size: int, port: int, model_dir: str, samples, adv, out: str) -> None:
    import torch.distributed as dist

    from online_rl.trainer.update import make_optimizer, update

    if size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.set_num_threads(1)
    model = load_pretrained(Path(model_dir))
    ref = load_pretrained(Path(model_dir)).eval()
    opt = make_optimizer(model, OptimConfig(lr=1e-3))
    update(model, ref, opt, samples, adv, LossConfig(kl_coef=0.05), OptimConfig(lr=1e-3, micro_batch=4))
    if rank == 0:
        torch.save(model.state_dict(), out)
    if size > 1:
        dist.destroy_process_group()


def test_two_ranks_make_the_same_update_as_one(test_model, tmp_path):
    import torch.multiprocessing as mp

    from infra.procs import free_port
    from tests.helpers import served_samples

    samples = served_samples(test_model)
    adv, _ = advantages(samples, LossConfig(), 0.0)
    _one_update(0, 1, 0, str(test_model), samples, adv, str(tmp_path / "one.pt"))
    mp.spawn(_one_update, args=(2, free_port(), str(test_model), samples, adv, str(tmp_path / "two.pt")), nprocs=2)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    base = load_pretrained(test_model).state_dict()
    moved = max((one[k] - base[k]).abs().max().item() for k in one)
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    assert moved > 1e-4, "the update moved the weights"
    # Float noise only: the ranks' micro-batches pad differently, and a gradient at that noise's level (~1e-10 on
    # an embedding row of a token no loss depends on, measured) still moves a weight by lr * g / (|g| + eps),
    # about 1% of lr under Adam's eps (1e-8): 1.1e-5 here at lr 1e-3. A real divergence moves whole updates.
    assert diff < 2e-5 * max(1.0, moved * 100), f"2 ranks differ from 1 by {diff} (update size {moved})"


def test_stale_samples_are_dropped(test_model, tmp_path):
    trainer = Trainer(TrainerConfig(model_dir=test_model, work_dir=tmp_path / "t", staleness=2, min_batch=1))
    trainer.version = 10
    c = trainer.model.cfg

    def mk(v):
        return Sample(
            key=f"v{v}",
            prompt_ids=np.array([0, 5]),
            output_ids=np.array([6]),
            behaviour_logprobs=np.array([-1.0], np.float32),
            routed_experts=np.zeros((2, c.num_hidden_layers, c.num_experts_per_tok), np.uint8),
            reward=1.0,
            model_version=v,
        )

    trainer.buffer = [mk(7), mk(8), mk(10)]
    batch = trainer._take_batch()
    assert [s.key for s in batch] == ["v8", "v10"]
    assert trainer.metrics.dropped.labels("stale")._value.get() == 1


def test_a_pass_failing_after_a_step_leaves_its_samples_trained_and_counted(test_model, tmp_path, monkeypatch):
    """--epochs 2, the second pass fails: the first step moved the weights, so the samples are in the ledger and
    their tenants' provenance as trained, the step counts, and the failure is recorded."""
    from online_rl.trainer import update as update_mod
    from tests.helpers import served_samples

    cfg = TrainerConfig(model_dir=test_model, work_dir=tmp_path / "t", min_batch=1, optim=OptimConfig(epochs=2))
    trainer = Trainer(cfg)
    real, calls = update_mod._one_pass, []

    def second_pass_fails(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected: the second pass fails")
        return real(*a, **k)

    monkeypatch.setattr(update_mod, "_one_pass", second_pass_fails)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.buffer = [dataclasses.replace(s, group=None) for s in served_samples(test_model, n=4)]
    m = trainer.train_step()
    assert m is not None and m["steps"] == 1 and trainer.step == 1 and len(calls) == 2
    assert trainer.failures.count("update") == 1
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert len(trainer.trained_since_ckpt) == 4 and all("dropped" not in e for e in trainer.trained_since_ckpt)
    assert sum(trainer.privacy.totals()[0].values()) == 4


def test_a_commented_sample_brings_fresh_student_samples_and_a_failure_costs_only_them(
    test_model, tmp_path, monkeypatch
):
    from online_rl.data import distill_samples
    from tests.helpers import served_samples

    def step(name, samples, **loss):
        t = Trainer(TrainerConfig(model_dir=test_model, work_dir=tmp_path / name, min_batch=1, loss=LossConfig(**loss)))
        t.buffer = samples
        return t, t.train_step()

    samples = served_samples(test_model, 4)
    for s in samples:
        s.group = None  # users' samples
    samples[1].hint_ids = np.array([11, 12, 13], np.int64)
    _, m = step("three", list(samples), distill_samples=3)
    assert m["user"] == 4 and 1 <= m["distill_samples"] <= 3  # empty completions are left out
    assert m["distill_tokens"] > samples[1].n_tokens  # the served one and the fresh ones
    _, m = step("none", list(samples), distill_samples=0)
    assert m["distill_samples"] == 0 and m["distill_tokens"] == samples[1].n_tokens

    # at most distill_contexts an update: this batch's first, the other waits with its updates untouched
    two = list(samples)
    two[3] = dataclasses.replace(two[3], hint_ids=np.array([14, 15], np.int64))
    t, m = step("capped", two, distill_samples=3, distill_contexts=1)
    assert 1 <= m["distill_samples"] <= 3 and [(c.key, left) for c, left in t.commented] == [(two[3].key, 1)]
    t, _ = step("no-backlog", list(two), distill_samples=3, distill_contexts=1, distill_backlog=0)
    assert t.commented == [] and t.metrics.dropped.labels("distill_backlog")._value.get() == 1
    # a full backlog drops the context already sampled, the one never sampled keeps all its updates
    t, _ = step("backlog", list(two), distill_samples=3, distill_contexts=1, distill_updates=2, distill_backlog=1)
    assert [(c.key, left) for c, left in t.commented] == [(two[3].key, 2)]
    assert t.metrics.dropped.labels("distill_backlog")._value.get() == 1
    assert t.commented[0][0].output_ids.size == 0  # waiting: only what sampling it again needs
    # distilled again in the next update (the student as it is then), also after a restart
    t, m = step("twice", list(samples), distill_samples=3, distill_updates=2)
    assert m["distill_samples"] >= 1 and [(c.key, left) for c, left in t.commented] == [(samples[1].key, 1)]
    t.save()
    again = Trainer(TrainerConfig(model_dir=test_model, work_dir=tmp_path / "twice", min_batch=1, loss=t.cfg.loss))
    assert [(c.key, left) for c, left in again.commented] == [(samples[1].key, 1)]
    plain = served_samples(test_model, 4, seed=5)  # no comments
    again.buffer = plain
    m = again.train_step()
    assert m["distill_samples"] >= 1 and m["distill_tokens"] > 0 and again.commented == []
    again.buffer = list(plain)
    assert again.train_step()["distill_samples"] == 0

    def broken(*a, **k):
        raise MemoryError("no room to sample")

    monkeypatch.setattr(distill_samples, "student_samples", broken)
    t, m = step("broken", list(samples), distill_updates=2)
    assert m["user"] == 4 and m["distill_samples"] == 0 and m["distill_tokens"] == samples[1].n_tokens
    assert [(c.key, left) for c, left in t.commented] == [(samples[1].key, 1)]  # this update's try is spent
    assert t.metrics.failures.labels("distill_samples", "MemoryError")._value.get() == 1


def test_batch_invariant_switch_makes_logprobs_independent_of_the_batch(test_model, tmp_path):
    from kernels import batch_invariant as bi
    from online_rl.model.transformer import token_logprobs
    from online_rl.trainer.loss import make_batch

    trainer = Trainer(TrainerConfig(model_dir=test_model, work_dir=tmp_path / "t", batch_invariant=True))
    try:
        assert bi.enabled()
        tok = _tok(test_model)
        train_tasks, _ = heldout_split()
        samples = [
            Sample(
                key=str(i),
                prompt_ids=np.asarray(p, np.int32),
                output_ids=np.asarray(o, np.int32),
                behaviour_logprobs=lp,
                routed_experts=ex,
                reward=0.0,
                model_version=0,
            )
            for i, (p, o, lp, ex) in enumerate(
                sample_completions(trainer.model, tok, train_tasks[:3], 2, torch.Generator().manual_seed(0))
            )
        ]
        longest = max(samples, key=lambda s: s.prompt_ids.size + s.output_ids.size)
        others = [s for s in samples if s is not longest][:4]

        def logprobs(batch_samples, index):
            b = make_batch(batch_samples, np.zeros(len(batch_samples)))
            with torch.no_grad():
                lp = token_logprobs(trainer.model(b.inputs, b.replay).logits, b.targets)
            n = batch_samples[index].prompt_ids.size + batch_samples[index].output_ids.size - 1
            return lp[index, :n]

        alone = logprobs([others[0]], 0)
        assert torch.equal(logprobs(others, 0), alone)
        assert torch.equal(logprobs([longest, *others], 1), alone)  # padded to the longest: still equal
    finally:
        bi.set_enabled(False)


class _RunsCode:
    """A pickle that runs a command when loaded with weights_only=False."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_round_trips_as_plain_state_and_refuses_pickled_code(test_model, tmp_path):
    import pickle

    cfg = TrainerConfig(model_dir=test_model, work_dir=tmp_path / "t")
    trainer = Trainer(cfg)
    c = trainer.model.cfg
    trainer.buffer = [
        Sample(
            key="k",
            prompt_ids=np.array([0, 5], np.int32),
            output_ids=np.array([6, 7], np.int32),
            behaviour_logprobs=np.array([-1.0, -2.0], np.float32),
            routed_experts=np.ones((3, c.num_hidden_layers, c.num_experts_per_tok), np.uint8),
            reward=0.75,
            model_version=3,
            event_ids=("a", "b"),
            baseline="implicit",
        )
    ]
    trainer.step, trainer.baseline = 5, {"explicit": 0.7, "implicit": -0.1}
    trainer.save()
    again = Trainer(cfg)
    (s,) = again.buffer
    assert again.step == 5 and s.key == "k" and s.event_ids == ("a", "b") and s.model_version == 3
    assert np.array_equal(s.routed_experts, trainer.buffer[0].routed_experts) and s.routed_experts.dtype == np.uint8
    assert again.baseline == {"explicit": 0.7, "implicit": -0.1} and s.baseline == "implicit"

    # A checkpoint from before implicit signals kept one baseline, a float: the explicit one.
    latest = trainer._latest() / "trainer.pt"
    state = torch.load(latest, weights_only=True)
    state["baseline"] = 0.3
    torch.save(state, latest)
    assert Trainer(cfg).baseline == {"explicit": 0.3}

    # A checkpoint that carries code (someone wrote into the trainer's directory): refused, not run.
    latest = trainer._latest() / "trainer.pt"
    state = torch.load(latest, weights_only=True)
    state["history"] = {"0": _RunsCode(tmp_path / "ran")}
    torch.save(state, latest)
    with pytest.raises(pickle.UnpicklingError):
        Trainer(cfg)
    assert not (tmp_path / "ran").exists()


def test_checkpoints_commit_durably_and_a_dangling_latest_is_fatal(test_model, tmp_path):
    import shutil

    from online_rl.trainer.checkpoints import CheckpointError

    cfg = TrainerConfig(model_dir=test_model, work_dir=tmp_path / "t")
    trainer = Trainer(cfg)
    trainer.step = 3
    trainer.trained_since_ckpt = [{"key": "a", "events": ["e1"]}]
    trainer.save()
    trainer.trained_since_ckpt = [{"key": "b", "events": ["e2"], "dropped": "stale"}]
    trainer.save()  # the same step again (a publish right after an update): a new checkpoint, not an overwrite
    first_latest = trainer._latest()
    assert [e["key"] for e in trainer.checkpoints.ledger_entries()] == ["a", "b"]
    # A save that wrote its ledger but died before LATEST: its entries are dropped at resume (work redone).
    (trainer.checkpoints.ledger / "step-00000004-ffffffffffffffff.json").write_text('[{"key": "c", "events": []}]')
    again = Trainer(cfg)
    assert again.step == 3 and again._latest() == first_latest
    assert [e["key"] for e in again.checkpoints.ledger_entries()] == ["a", "b"]
    for _ in range(3):  # older checkpoints are pruned, never the current one
        again.step += 1
        again.save()
    dirs = sorted(p.name for p in (tmp_path / "t" / "checkpoints").glob("step-*"))
    assert len(dirs) == 2 and again._latest().name == dirs[-1]
    # LATEST names a directory that is gone: fatal, never a silent start from the base model.
    shutil.rmtree(again._latest())
    with pytest.raises(CheckpointError, match="refusing to start from the base model"):
        Trainer(cfg)
