"""The trainer daemon (`flywheel train`): a short loop over clear parts.

    while running:
        ingest   Kafka completions + feedback -> Joiner -> rewarded user samples
        rollout  held-out tasks on serving replicas -> sandbox -> grouped samples
        update   staleness filter -> advantages -> policy-gradient step (router replay, TIS, k2 KL)
        save     model + optimizer + joiner + unconsumed samples + Kafka offsets, atomically;
                 only then commit the offsets (exactly once across kill -9)
        publish  every publish interval: bf16 checkpoint -> weight_sync.publish -> new version

The parts: online_rl.data.reader (Kafka: assign, seek, offsets), online_rl.trainer.checkpoints (commit, ledger),
online_rl.trainer.publisher (store, announcements), online_rl.trainer.metrics, online_rl.data.tenants (tenants' privacy:
what is never trained on, what a forget drops) and online_rl.data.provenance (whose samples each version saw).
Rank 0 does all I/O; with --nproc N the other ranks follow its commands (online_rl.trainer.ranks): each update
(online_rl.trainer.update) and, with --shard fsdp (online_rl.trainer.sharding), each sharded save and each gather of the
weights to publish.

Why one file: the Trainer is the loop, and its parts (ingest, batch, update, save, publish) each read and
move the same state (buffer, step, version, ledger, offsets) that one checkpoint holds; the work is in the
modules named above.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from contracts import control, events as ev
from kernels import batch_invariant as bi
from online_rl.config import TrainerConfig
from online_rl.data import tenant_share
from online_rl.data.distill_samples import sample_commented
from online_rl.data.join import Joiner
from online_rl.data.reader import StreamReader
from online_rl.data.samples import DISTILL, InvalidSample, Sample
from online_rl.data.tenants import TenantGate
from online_rl.model.tokenizer import tokenizer_tools
from online_rl.model.transformer import load_pretrained
from online_rl.offpeak import OffPeakScheduler
from online_rl.rollouts import RolloutSource
from online_rl.sandbox import judge as sandbox
from online_rl.trainer.checkpoints import Checkpoints
from online_rl.trainer.failures import Failures
from online_rl.trainer.loss import advantages, as_baselines
from online_rl.trainer.metrics import TrainerMetrics, step_line
from online_rl.trainer.publisher import Publisher
from online_rl.trainer.ranks import SHARDS, command, load_shards, save_shards
from online_rl.trainer.sharding import load_sharded
from online_rl.trainer.update import PartialUpdate, make_optimizer, update, world

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: TrainerConfig):
        self.cfg = cfg
        self.rank, self.world = world()
        torch.manual_seed(cfg.seed)
        bi.set_enabled(cfg.batch_invariant)
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // self.world))
        self.work = Path(cfg.work_dir)
        self.fsdp = cfg.sharding.shard == "fsdp"
        if self.fsdp and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise RuntimeError("--shard fsdp needs a process group: start it with `flywheel train` (any --nproc)")
        device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
        # Sharded: each rank reads only its rows (the reference, as large as the model, is sharded too).
        load = (
            (lambda: load_sharded(cfg.model_dir, cfg.sharding, device))
            if self.fsdp
            else (lambda: load_pretrained(cfg.model_dir).to(device))
        )
        self.ref = load().eval() if cfg.loss.kl_coef else None
        if self.ref is not None:
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.model = load().train()
        self.opt = make_optimizer(self.model, cfg.optim)  # after sharding: its state is sharded alike
        text_len, encode, hint_fits, self._stop_ids = tokenizer_tools(cfg.model_dir, self.model.cfg.eos_ids)
        self._distill_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self._distill_s = 0.0  # seconds the last update spent sampling them
        # Commented samples whose context is sampled and distilled in later updates, and in how many more.
        self.commented: list[tuple[Sample, int]] = []
        if self.fsdp and self.world > 1 and cfg.loss.distill_samples and cfg.loss.distill_coef and self.rank == 0:
            log.warning("--distill-samples: not under --shard fsdp across ranks; a comment distils its own sample")
        self.joiner = Joiner(cfg.join, cfg.rewards, text_len=text_len, encode=encode, hint_fits=hint_fits)
        self.buffer: list[Sample] = []
        self.step = 0
        self.saved_step = 0  # the step the newest checkpoint holds
        self.version = 0  # the newest published version (samples are judged stale against it)
        self.baseline: dict[str, float] = {}  # running mean user reward, per Sample.baseline (online_rl.trainer.loss)
        self.trained_since_ckpt: list[dict] = []  # the ledger of the next checkpoint: samples trained or dropped
        self.history: dict[str, dict] = {}  # version -> reward/acceptance sums (history.json, the plot)
        self.rolled_back: set[int] = set()  # versions a canary trial rolled back (weights topic)
        self.metrics = TrainerMetrics(lambda: self.joiner.stats, waiting=lambda: len(self.joiner.held), trainer=self)
        self.privacy = TenantGate(self.metrics.registry, holder=self)  # tenants' policies (online_rl.data.tenants)
        self.joiner.refuse = self.privacy.refuse
        self.failures = Failures(self.metrics.failures, cfg.retry)
        self.reader = StreamReader(cfg.kafka_bootstrap, cfg.group_id, cfg.poll_ms, self.metrics.registry)
        self.checkpoints = Checkpoints(self.work)
        self.publisher = Publisher(
            cfg.publish, cfg.model_dir, self.work, self.failures, cfg.kafka_bootstrap, self.rank == 0
        )
        self.rollouts = RolloutSource(cfg.rollouts, self.failures)
        if cfg.rollouts.tasks_per_step and cfg.rollouts.gateway_url and self.rank == 0:
            sandbox.check(cfg.rollouts.sandbox)  # no isolation, no rollouts: refuse to start, say why
        self._control_key = None
        if cfg.publish.key is not None and Path(cfg.publish.key).exists():
            from weight_sync.manifest import load_private

            self._control_key = load_private(cfg.publish.key).public_key()
        self._control_guard = control.ReplayGuard()
        self._ranks_broken = False  # an update failed mid-collective: the run ends, and the spawn with it
        self._resume()

    # ------------------------------------------------------------------ the loop
    def run(self, stop=None) -> None:
        if self.cfg.metrics_port and self.rank == 0:
            from prometheus_client import start_http_server

            start_http_server(self.cfg.metrics_port, addr=self.cfg.metrics_host, registry=self.metrics.registry)
        scheduler = OffPeakScheduler(self.cfg.offpeak).start() if self.cfg.offpeak and self.rank == 0 else None
        try:
            while (stop is None or not stop.is_set()) and (
                self.cfg.max_steps is None or self.step < self.cfg.max_steps
            ):
                consumed = self.ingest()
                m = self.train_step()
                if m is not None:
                    log.info("%s", step_line(m))
                    if self.step % self.cfg.checkpoint_every == 0:
                        self.checkpoint()
                elif not consumed:
                    self.checkpoint()  # caught up and idle: no trained steps left outside a checkpoint
                if self.publisher.due(self.step):
                    self.checkpoint()
                    self.publish()
                self.publisher.announce()
            if self.step != self.saved_step or self.trained_since_ckpt or self.privacy.purged:
                self.save()
        finally:
            if scheduler is not None:
                scheduler.stop()  # every borrowed replica goes back to users
            if self.world > 1 and not self._ranks_broken:
                command(("stop",))  # (after a failed update the others are inside its collectives: no stop)
            self.reader.close()

    # ------------------------------------------------------------------ checkpoint (exactly once)
    def _latest(self) -> Path | None:
        return self.checkpoints.latest()

    def _resume(self) -> None:
        state = self.checkpoints.load(prune=self.rank == 0)
        if state is None:
            return
        if ("model" not in state) != self.fsdp:
            raise RuntimeError(
                f"{self.checkpoints.latest()} was written with --shard {'dp' if 'model' in state else 'fsdp'}: "
                f"resume it with that (or start a new --work-dir)"
            )
        if self.fsdp:  # every rank its own shards (DCP reshards when the number of ranks changed)
            load_shards(self.model, self.opt, self.checkpoints.latest() / SHARDS)  # type: ignore[operator]  # load() found it
        else:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
        self.joiner.load_state(state["joiner"])
        self.privacy.load_state(state.get("privacy"), older=self.checkpoints.others(self.checkpoints.latest()))  # type: ignore[arg-type]
        self.buffer = [Sample.from_state(d) for d in state["buffer"]]
        self.commented = [(Sample.from_state(d["sample"]), d["left"]) for d in state.get("commented", [])]
        if "distill_rng" in state:  # the draws go on where they were, as in a run never stopped
            self._distill_gen.set_state(state["distill_rng"])
        old = sum(s.source == "user" and not s.tenant for s in self.buffer + [c for c, _ in self.commented])
        if old and self.rank == 0:  # a checkpoint from before tenants: its samples carry no tenant, nor time
            log.warning("%d user samples with no tenant (an older checkpoint): no forget or deny applies", old)
        self.reader.offsets = state["offsets"]
        self.step, self.version, self.baseline = state["step"], state["version"], as_baselines(state["baseline"])
        self.saved_step = self.step
        self.history = state.get("history", {})
        self.rolled_back = set(state.get("rolled_back", []))
        self._control_guard = control.ReplayGuard(state.get("control_seq", 0))
        self.publisher.resumed(self.step)
        if self.rank == 0:
            log.info(
                "resumed at step %d (version %d, %d buffered samples) from %s",
                self.step,
                self.version,
                len(self.buffer),
                self.checkpoints.latest(),
            )

    def save(self) -> None:
        """Everything needed to continue, committed as one new checkpoint (online_rl.trainer.checkpoints); then
        the Kafka offsets it holds are committed to the group too."""
        if self.rank != 0:
            return
        weights = {} if self.fsdp else {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
        purged = self.privacy.purged  # a tenant dropped: the checkpoints from before still hold its samples
        saved = self.checkpoints.save(
            {
                **weights,
                "joiner": self.joiner.state(),
                "privacy": self.privacy.state(),
                "buffer": [b.state() for b in self.buffer],
                "commented": [{"sample": c.state(), "left": left} for c, left in self.commented],
                "distill_rng": self._distill_gen.get_state(),
                "offsets": dict(self.reader.offsets),
                "step": self.step,
                "version": self.version,
                "baseline": self.baseline,
                "history": self.history,
                "rolled_back": sorted(self.rolled_back),
                "control_seq": self._control_guard.last,
            },
            self.step,
            self.trained_since_ckpt,
            write_shards=self._save_shards if self.fsdp else None,
            keep=1 if purged else None,
        )
        self.privacy.purged = purged and bool(self.checkpoints.others(saved))  # one not removed: the next save
        self.trained_since_ckpt = []
        self.saved_step = self.step
        self.reader.commit()

    def _save_shards(self, directory: Path) -> None:
        command(("save", str(directory / SHARDS)))
        save_shards(self.model, self.opt, directory / SHARDS)

    def checkpoint(self) -> None:
        """save() if anything was trained (or a tenant purged) since the last checkpoint, living through a disk that
        is full or failing: nothing is committed (the offsets neither), the steps since the last checkpoint
        stay in memory, and the next call tries again (after backoff)."""
        if (self.step == self.saved_step and not self.privacy.purged) or not self.failures.ready("checkpoint"):
            return
        try:
            self.save()
        except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
            self.failures.failed("checkpoint", e, retry=True)
            return
        self.failures.succeeded("checkpoint")

    def drop_samples(self, gone: Callable[[Sample], bool], reason: str) -> tuple[int, int]:
        """Drop the buffered samples (ledgered as dropped for `reason`) and commented contexts `gone` says (a
        forget or a deny: online_rl.data.tenants). Returns how many of each."""
        samples = [s for s in self.buffer if gone(s)]
        self.buffer = [s for s in self.buffer if not gone(s)]
        for s in samples:
            self._ledger(s, reason)
        contexts = len(self.commented)
        self.commented = [(s, left) for s, left in self.commented if not gone(s)]
        return len(samples), contexts - len(self.commented)

    def _ledger(self, s: Sample, dropped: str | None = None) -> None:
        """A user sample trained (or dropped, and why), for the next checkpoint's ledger."""
        if s.source == "user":
            entry = {"key": s.key, "tenant": s.tenant, "events": list(s.event_ids)}
            self.trained_since_ckpt.append(entry if dropped is None else {**entry, "dropped": dropped})

    # ------------------------------------------------------------------ ingest
    def ingest(self) -> int:
        """Reads what the stream has (completions and feedback into the Joiner, rollbacks from the weights
        topic); the broker away is a failure to back off from, never a crash."""
        if not self.cfg.kafka_bootstrap:
            return 0
        if not self.failures.ready("ingest"):
            time.sleep(self.cfg.poll_ms / 1000)
            return 0
        try:
            batch = self.reader.fetch()
        except Exception as e:  # the broker is away: keep training what is buffered, try again later
            self.failures.failed("ingest", e, retry=True)  # backoff whatever the cause: never a hot loop
            return 0
        self.failures.succeeded("ingest")
        n = 0
        for topic, value in self.reader.events(batch):  # decoded and checked: a bad record is refused there
            if topic == ev.TOPIC_WEIGHTS:
                self._weights_record(value)
            elif topic == ev.TOPIC_TENANTS:
                self.privacy.record(value)
            else:
                self.buffer.extend(self.joiner.add(value))
            n += 1
        # Caught up: let wall time age the windows. Samples whose wait for a delayed signal ended come back.
        self.buffer.extend(self.joiner.expire(None if n else time.time()))
        return n

    def _weights_record(self, raw: bytes) -> None:
        """A canary trial that rolled a version back: its samples stop feeding updates (they remain signals
        about that version in the stream and the metrics). Only records signed by our key count."""
        if self._control_key is None:
            return  # no key to verify with (a trainer that does not publish): nothing to act on
        try:
            record = self._control_guard.check(control.decode(raw, self._control_key))
        except control.ControlError as e:  # counted (and dead-lettered) as refused, never acted on
            self.failures.failed("control_record", e, retry=False)
            return self.reader.refuse(ev.TOPIC_WEIGHTS, raw, e)
        if record["type"] == "rollback":
            if record["version"] not in self.rolled_back:
                log.info(
                    "v%d was rolled back (%s): its samples are %s",
                    record["version"],
                    record.get("reason"),
                    "still trained" if self.cfg.train_on_rolled_back else "no longer trained",
                )
            self.rolled_back.add(record["version"])

    # ------------------------------------------------------------------ update
    def _problem(self, s: Sample) -> str | None:
        c = self.model.cfg
        return s.problem(c.vocab_size, c.moe_layers, c.num_experts_per_tok, c.num_experts, self.cfg.max_sample_tokens)

    def _invalid(self, s: Sample, problem: str) -> None:
        self.metrics.dropped.labels("invalid").inc()
        self.failures.failed("sample", InvalidSample(f"{s.key}: {problem}"), retry=False)
        self._ledger(s, "invalid")

    def _take_batch(self) -> list[Sample]:
        fresh, batch = list[Sample](), list[Sample]()
        for s in self.buffer:
            if (why := self.privacy.refuse_sample(s)) is not None:  # its tenant's policy now (counted there)
                self._ledger(s, why)
            elif (problem := self._problem(s)) is not None:
                self._invalid(s, problem)
            elif s.model_version in self.rolled_back and not self.cfg.train_on_rolled_back:
                self.metrics.dropped.labels("rolled_back").inc()
                self._ledger(s, "rolled_back")
            elif self.version - s.model_version > self.cfg.staleness:
                self.metrics.dropped.labels("stale").inc()
                self._ledger(s, "stale")
            else:
                fresh.append(s)
        batch, self.buffer = tenant_share.take_batch(self, fresh)  # no tenant fills it
        return batch

    def _distill_samples(self, samples: list[Sample]) -> list[Sample]:
        """The student's fresh samples of commented contexts (online_rl.data.distill_samples.sample_commented). Rank 0
        samples alone, so only where it holds the whole model (not under FSDP across ranks)."""
        cfg, self._distill_s = self.cfg.loss, 0.0  # a step that samples nothing reports 0, not the last one's
        # a waiting context's tenant policy now (its retention runs on; counted there)
        self.commented = [(s, left) for s, left in self.commented if self.privacy.refuse_sample(s) is None]
        if not (cfg.distill_samples and cfg.distill_coef) or self._stop_ids is None or (self.fsdp and self.world > 1):
            return []
        t0 = time.perf_counter()
        fresh, self.commented, dropped = sample_commented(
            self.model,
            samples,
            self.commented,
            cfg,
            self._stop_ids,
            self._distill_gen,
            self.version,
            lambda e: self.failures.failed("distill_samples", e, retry=False),
        )
        if dropped:
            self.metrics.dropped.labels("distill_backlog").inc(dropped)
        self._distill_s = time.perf_counter() - t0
        return fresh

    def train_step(self, force: bool = False) -> dict | None:
        """Rank 0: one update if there is enough to learn from. Returns its metrics."""
        rollouts, pass_rates = self.rollouts.samples(self.step)
        if len(self.buffer) + len(rollouts) < (1 if force else self.cfg.min_batch):
            return None
        valid_rollouts = []
        for s in rollouts:
            if (problem := self._problem(s)) is not None:
                self._invalid(s, problem)
            else:
                valid_rollouts.append(s)
        samples = [s for s in self._take_batch() + valid_rollouts if s.n_tokens > 0]
        if not samples:
            return None
        samples += self._distill_samples(samples)
        try:
            adv, self.baseline = advantages(samples, self.cfg.loss, self.baseline)
            if self.world > 1:
                command(("update", samples, adv))
            m = update(self.model, self.ref, self.opt, samples, adv, self.cfg.loss, self.cfg.optim)
        except Exception as e:  # a batch the checks let through and the update cannot take: skip it, go on
            if self.world > 1:
                self._ranks_broken = True
                raise  # the other ranks are inside the update's collectives: skipping alone would hang them
            self.failures.failed("update", (e.__cause__ or e) if isinstance(e, PartialUpdate) else e, retry=False)
            if not isinstance(e, PartialUpdate):
                self.opt.zero_grad(set_to_none=True)
                for s in samples:
                    self._ledger(s, "update_failed")
                return None
            m = e.metrics  # a later pass failed: the steps before it moved the weights, the samples count as trained
        self.step += 1
        for s in samples:
            self.metrics.samples.labels(s.source).inc()
            self._ledger(s)
            self.privacy.trained_on(s)
        self.metrics.trained(self.history, m, samples, self.version, pass_rates)
        self.metrics.step.set(self.step)
        m.update(
            step=self.step,
            user=sum(s.source == "user" for s in samples),
            distill_samples=sum(s.source == DISTILL for s in samples),
            distill_sample_s=self._distill_s,
            rollout=len(rollouts),
            rollout_pass=float(np.mean(pass_rates)) if pass_rates else None,
        )
        return m

    # ------------------------------------------------------------------ publish
    def publish(self) -> int | None:
        """The current weights as the next version (online_rl.trainer.publisher); a failure waits for the next try."""
        if self.fsdp and self.world > 1 and self.publisher.enabled:  # enabled: publish() gathers, first thing
            command(("export",))  # the other ranks take part in gathering each full tensor
        try:
            version = self.publisher.publish(self.model, self.step, self.history, *self.privacy.totals())
        except Exception as e:  # store or disk trouble: the weights wait for the next try
            self.failures.failed("publish", e, retry=True)
            return None
        self.failures.succeeded("publish")
        if version is not None:
            self.version = version
            self.metrics.version.set(version)
        return version
