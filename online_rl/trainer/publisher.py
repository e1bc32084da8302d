"""The trainer's hand-off to weight_sync: the current weights as the next version in the store, then its
announcement on the weights topic (with --gate, the eval gate's: online_rl.gate judges the version first).

Publishing and announcing are apart: a version committed to the store but not announced (the broker
away, or a kill between the two) stays pending and is announced, oldest first, before anything newer;
a trainer that restarts finds the store's unannounced versions and announces them first. Each version's
provenance (the tenants whose samples it was trained on: online_rl.data.provenance) is written beside it, v0's too:
its totals before the store commit (no record, no version), its record after. Nothing after the commit can fail
the publish (a failed publish is retried, and a retry would publish the same weights as another version): a
record not written then is counted (flywheel_trainer_failures{stage="provenance"}) and logged, and the next
publish, or the next start, records it from the totals written before (provenance.reconcile).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import torch

from online_rl.config import PublisherConfig
from online_rl.data import provenance
from online_rl.trainer.export import save_streaming
from online_rl.trainer.failures import Failures
from weight_sync.checkpoint import SIDE_FILES  # what makes a checkpoint directory loadable

log = logging.getLogger(__name__)


class Publisher:
    def __init__(
        self,
        cfg: PublisherConfig,
        base_model: Path,
        work: Path,
        failures: Failures,
        kafka_bootstrap: str | None = None,
        enabled: bool = True,
    ):
        self.cfg, self.base_model, self.failures, self.kafka = cfg, Path(base_model), failures, kafka_bootstrap
        self.enabled = enabled and cfg.store is not None  # rank 0 only
        self.dir = Path(work) / "published"
        self.last = time.monotonic()
        self.published_step: int | None = None  # the step the newest version holds (None: not yet, this run)
        self.pending: list[dict] = []  # published to the store, not yet on the weights topic
        if self.enabled and kafka_bootstrap:
            from weight_sync.publish import unannounced

            # A trainer killed between committing a version and announcing it: announce it now, first. With the
            # gate, only v0 (never gated): the gate announces the others once it has judged them.
            self.pending = [r for r in unannounced(self._config()) if not cfg.gate or r["version"] == 0]
        if self.enabled:
            from weight_sync.store.server import Store

            self._reconcile(Store(self._store()))

    def _store(self) -> Path:
        assert self.cfg.store is not None, "enabled: it has a store"
        return self.cfg.store

    def _config(self):
        from weight_sync.publish import PublishConfig

        return PublishConfig(
            store=self._store(),
            # None: the store's default key ($FLYWHEEL_HOME/weights/keys/signing.pem, filled in by PublishConfig);
            # publish() fails, as a failed publish, where there is none
            private_key=self.cfg.key,  # type: ignore[arg-type]
            kafka_bootstrap=self.kafka,
            store_url=self.cfg.store_url,
            s3_url=self.cfg.s3_url,
            canary=self.cfg.canary,
        )

    def resumed(self, step: int) -> None:
        """After a restart at `step`: whether those weights are already a version (no publishing them twice)."""
        done = [int(p.parent.name.split("-")[1]) for p in self.dir.glob("step-*/PUBLISHED")]
        if step in done:
            self.published_step = step

    def due(self, step: int) -> bool:
        """The interval has passed and there is something new: publishing the same weights again would
        only make the fleet switch for nothing."""
        return (
            self.enabled
            and time.monotonic() - self.last >= self.cfg.interval_s
            and step != self.published_step
            and self.failures.ready("publish")
        )

    def publish(
        self,
        model: torch.nn.Module,
        step: int,
        history: dict,
        tenants: dict[str, int] | None = None,
        distilled: dict[str, int] | None = None,
    ) -> int | None:
        """The weights as the next version in the store (announce() follows); the version, or None when
        this trainer does not publish. `history` (reward and acceptance by version) is written beside it
        as history.json, for `flywheel train-plot` and the demo; `tenants` and `distilled` (user samples, and
        students' samples of their commented contexts, trained by tenant since the first step) as its
        provenance."""
        if not self.enabled:
            return None
        from weight_sync.publish import publish
        from weight_sync.store.server import Store

        out = self.dir / f"step-{step:08d}"
        shutil.rmtree(out, ignore_errors=True)
        # First: a sharded model's other ranks are gathering with this one until the last tensor.
        save_streaming(model, out, torch.bfloat16)
        pcfg, store, work = self._config(), Store(self._store()), self.dir.parent
        self._reconcile(store)  # versions an earlier publish committed without writing their records
        if store.latest() is None:
            # v0 = the starting model, the version the fleet serves first
            base = publish(self.base_model, pcfg, announce_now=False)
            self.pending.append(base.announcement)  # v0 is the fleet's first version: never gated
            self._after_commit("provenance", lambda: provenance.write(work, base.version, 0, {}))
        for name in SIDE_FILES:
            if name != "config.json" and (self.base_model / name).exists():
                shutil.copyfile(self.base_model / name, out / name)
        shutil.copyfile(self.base_model / "config.json", out / "config.json")  # the served config, as is
        # Whose samples these weights saw, before they can be a version: a failure here fails this publish.
        provenance.write_pending(work, step, tenants or {}, distilled or {}, store.latest())
        result = publish(out, pcfg, announce_now=False)
        # In the store now: from here on nothing fails the publish (its retry would be a second version).
        if not self.cfg.gate:  # else the eval gate judges it first, then announces it or records the block
            self.pending.append(result.announcement)
        self.published_step = step
        self.last = time.monotonic()

        def record() -> None:
            provenance.write(work, result.version, step, tenants or {}, distilled=distilled or {})
            provenance.clear_pending(work)

        self._after_commit("provenance", record)
        # read by resumed(): no republishing the same weights
        self._after_commit("publish_marker", lambda: (out / "PUBLISHED").write_text(str(result.version)))
        for old in sorted(self.dir.glob("step-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self._after_commit("history", lambda: self._history(history))  # a figure's data
        log.info("published v%d at step %d (%s, %.1fx)", result.version, step, result.kind, result.ratio)
        self.announce()
        return result.version

    def _history(self, history: dict) -> None:
        tmp = self.dir.parent / "history.json.tmp"
        tmp.write_text(json.dumps(history, sort_keys=True))
        tmp.replace(self.dir.parent / "history.json")

    def _after_commit(self, stage: str, write) -> None:
        """A write after the version is in the store: a failure, whatever it is, is counted
        (flywheel_trainer_failures{stage}) and logged, never a failed publish (nor a version published twice)."""
        try:
            write()
        except Exception as e:
            self.failures.failed(stage, e, retry=False)

    def _reconcile(self, store) -> None:
        """Record the versions committed without their provenance (provenance.reconcile), and mark their
        exported steps as published (resumed(): the same weights are not published again)."""

        def published_at(v: int) -> float:
            return store.version_dir(v).stat().st_mtime

        def reconcile() -> None:
            for version, step in provenance.reconcile(self.dir.parent, store.versions(), published_at):
                marker = self.dir / f"step-{step:08d}" / "PUBLISHED" if step else None
                if marker is not None and marker.parent.is_dir() and not marker.exists():
                    marker.write_text(str(version))

        self._after_commit("provenance", reconcile)

    def announce(self) -> bool:
        """Put published versions on the weights topic, oldest first. One that fails (the broker away)
        stays pending and is retried after backoff; True when nothing is pending."""
        from weight_sync.publish import announce

        while self.pending and self.failures.ready("announce"):
            try:
                announce(self._config(), self.pending[0], self.cfg.announce_timeout_s)
            except Exception as e:
                self.failures.failed("announce", e, retry=True)
                return False
            self.pending.pop(0)
            self.failures.succeeded("announce")
        return not self.pending
