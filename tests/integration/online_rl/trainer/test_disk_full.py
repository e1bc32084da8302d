"""A full disk under the trainer's checkpoints and under the weight store (DESIGN's faults: disk full), each
on a real small tmpfs: the write fails with ENOSPC, nothing half-written is left or becomes visible (no
checkpoint staging, no ledger of an uncommitted save, no version staging), the last committed state stays
the current one, and the same write succeeds once there is room. The event spool's full disk is
test_event_log_faults; the chaos run (`python -m benchmarks.chaos`) fills these disks under a live loop."""

from __future__ import annotations

import errno
import subprocess

import pytest
import torch

from online_rl.trainer.checkpoints import Checkpoints
from tests.helpers import small_tmpfs
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs (root is available here and in CI), unmounted by the test that made it."""
    with small_tmpfs(tmp_path / "fs", "256k") as mnt:
        yield mnt


def _grow(mnt, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


def test_a_checkpoint_on_a_full_disk_leaves_the_last_one_current(small_fs):
    ck = Checkpoints(small_fs / "trainer")
    ck.save({"step": 1, "w": torch.zeros(1000)}, 1, [{"key": "a"}])
    # 4 MB into 256 KiB; torch.save's writer reports the full disk as a RuntimeError (the trainer retries both).
    with pytest.raises((OSError, RuntimeError)):
        ck.save({"step": 2, "w": torch.zeros(1_000_000)}, 2, [{"key": "b"}])
    assert not list(ck.root.glob(".step-*.tmp")) and [p.name for p in ck.ledger.iterdir()] == [
        f"{ck.latest().name}.json"
    ]  # the failed save's staging and ledger are gone
    assert ck.load()["step"] == 1  # the last committed checkpoint is still the current one
    _grow(small_fs, "16m")  # room again: the same save commits
    ck.save({"step": 2, "w": torch.zeros(1_000_000)}, 2, [{"key": "b"}])
    assert ck.load()["step"] == 2


def test_a_publish_to_a_full_store_is_invisible_and_the_next_one_lands(test_model, small_fs, tmp_path):
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=small_fs / "store", private_key=tmp_path / "s.pem")
    with pytest.raises(OSError) as e:  # the test model's weights (~0.5 MB) do not fit in 256 KiB
        publish(test_model, cfg)
    assert e.value.errno == errno.ENOSPC
    store = Store(cfg.store)
    assert store.versions() == [] and not list(cfg.store.glob(".staging-*"))
    assert not list(cfg.store.glob(".head*"))  # the publisher's base for the next delta: not from a failed one
    _grow(small_fs, "64m")
    assert publish(test_model, cfg).version == 0 and store.versions() == [0]
