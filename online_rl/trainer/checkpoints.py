"""The trainer's checkpoints and its ledger: exactly-once accounting across kill -9.

Each save is a new directory `checkpoints/step-<step>-<ns>` (never reused, so a save never deletes or
overwrites the directory LATEST names), holding `trainer.pt` (tensors and plain values only: loaded
with weights_only=True); beside it `ledger/<same name>.json` lists the samples that save trained or
dropped. Every file and directory is fsynced before `LATEST` is rewritten (atomically, fsynced too):
that rename is the commit point. At resume, ledger files newer than LATEST belong to a save that never
committed (its work is redone) and are removed. A LATEST that names a missing directory is fatal:
starting over from the base model would skip every event whose offset that checkpoint had committed.
The newest `keep` checkpoints stay; a save with keep=1 removes every older one (after a tenant is forgotten
or denied: online_rl.data.tenants, the checkpoints from before hold its token ids and events).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import torch

from infra.files import fsync_path, write_durably


class CheckpointError(RuntimeError):
    """The checkpoint directory is not in a state the trainer can continue from."""


class Checkpoints:
    def __init__(self, work: Path, keep: int = 2):
        self.root = Path(work) / "checkpoints"
        self.ledger = Path(work) / "ledger"
        self.keep = keep
        for d in (self.root, self.ledger):
            d.mkdir(parents=True, exist_ok=True)

    def latest(self) -> Path | None:
        pointer = self.root / "LATEST"
        if not pointer.exists():
            return None
        name = pointer.read_text().strip()
        path = self.root / name
        if not name or not (path / "trainer.pt").exists():
            raise CheckpointError(
                f"{pointer} names {name!r}, which is missing or incomplete: refusing to start "
                f"from the base model (its committed offsets are past the events it trained). "
                f"Restore that checkpoint, or remove {self.root} and the consumer group's "
                f"offsets to start over on purpose."
            )
        return path

    def load(self, prune: bool = True) -> dict | None:
        """The newest committed state, or None; prune: remove ledger files of saves that never committed
        (rank 0 only: another rank still starting must not remove the ledger of a save rank 0 is making)."""
        latest = self.latest()
        if latest is None:
            return None
        # Tensors and plain state only: a checkpoint file cannot carry code to run at the next resume.
        try:
            state = torch.load(latest / "trainer.pt", weights_only=True)
        except pickle.UnpicklingError as e:
            if "online_rl.data.samples.Sample" in str(e):
                raise CheckpointError(
                    f"{latest} was written by an older Flywheel (pickled Sample objects) and "
                    f"is not loaded as code; resume it with that version, or start over "
                    f"on purpose (remove {self.root})"
                ) from e
            raise
        for f in self.ledger.glob("step-*.json") if prune else ():
            if f.stem > latest.name:
                f.unlink()
        return state

    def save(self, state: dict, step: int, ledger: list[dict], write_shards=None, keep: int | None = None) -> Path:
        """Write `state` and its ledger as a new checkpoint and make it current. Returns its directory.
        write_shards(directory): writes what is not in `state` (a sharded model's files, every rank's)
        into the new checkpoint before it commits; its files are fsynced here with the rest. keep: how many
        checkpoints stay, this one included (None: self.keep; 1: every older one is removed)."""
        name = f"step-{step:08d}-{time.time_ns():016x}"  # sorts by step, then by time
        tmp = self.root / f".{name}.tmp"
        ledger_file = self.ledger / f"{name}.json"
        try:
            tmp.mkdir()
            if write_shards is not None:
                write_shards(tmp)
            torch.save(state, tmp / "trainer.pt")
            for d in [p for p in tmp.rglob("*") if p.is_dir()] + [tmp]:  # every file is fsynced by its writer
                fsync_path(d)
            fsync_path(tmp / "trainer.pt")
            write_durably(ledger_file, json.dumps(ledger).encode())
            final = self.root / name
            os.replace(tmp, final)
            fsync_path(self.root)
            write_durably(self.root / "LATEST", name.encode())  # the commit point
        except BaseException:
            # Not committed: its ledger must not outlive it (the retry writes these entries again under
            # a later name; a kill -9 here leaves a name after LATEST's, which load() removes).
            ledger_file.unlink(missing_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        keep = self.keep if keep is None else keep
        for old in self.others(final)[: -(keep - 1) or None]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".step-*.tmp"):
            if stale != tmp:
                shutil.rmtree(stale, ignore_errors=True)
        return final

    def others(self, checkpoint: Path) -> list[Path]:
        """The checkpoint directories on disk other than `checkpoint`, oldest first."""
        return sorted(p for p in self.root.glob("step-*") if p.name != Path(checkpoint).name)

    def ledger_entries(self) -> list[dict]:
        """Every committed ledger entry, oldest first."""
        return [e for f in sorted(self.ledger.glob("step-*.json")) for e in json.loads(f.read_text())]
