"""The trainer daemon (`flywheel train`): a short loop over clear parts.

    while running:
        ingest   Kafka completions + feedback -> Joiner -> rewarded user samples
        rollout  held-out tasks on serving replicas -> sandbox -> grouped samples
        update   staleness filter -> advantages -> policy-gradient step (router replay, TIS, k1 KL)
        save     model + optimizer + joiner + unconsumed samples + Kafka offsets, atomically;
                 only then commit the offsets (exactly once across kill -9)
        publish  every publish_interval: bf16 checkpoint -> weight_sync.publish -> new version

Rank 0 does all I/O; with --nproc N the other ranks join each update (online_rl.update).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flywheel.core import control, events as ev
from kernels import batch_invariant as bi
from online_rl import sandbox
from online_rl.checkpoints import Checkpoints
from online_rl.failures import Failures, RetryConfig
from online_rl.loss import LossConfig, advantages
from online_rl.model import load_pretrained, save_pretrained
from online_rl.offpeak import OffPeakConfig, OffPeakScheduler
from online_rl.rollouts import RolloutConfig, RolloutSource
from online_rl.samples import InvalidSample, RewardTable, Sample
from online_rl.stream import JoinConfig, Joiner
from online_rl.update import OptimConfig, make_optimizer, share_batch, update, world

log = logging.getLogger(__name__)
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@dataclass
class TrainerConfig:
    model_dir: Path  # the starting checkpoint, also the KL reference
    work_dir: Path = Path("trainer")
    kafka_bootstrap: str | None = None
    group_id: str = "flywheel-trainer"
    batch_size: int = 32  # samples per update
    min_batch: int = 8  # a smaller batch waits for more samples, unless rollouts fill it
    staleness: int = 4  # eta: samples produced more than this many versions ago are dropped
    checkpoint_every: int = 1  # updates between checkpoints (offsets are committed at each checkpoint)
    publish_interval_s: float = 3600.0
    publish_store: Path | None = None  # weight_sync store; None: do not publish
    publish_key: Path | None = None
    publish_store_url: str | None = None
    publish_canary: bool = False  # new versions go through a canary trial (weight_sync.canary) before the fleet
    max_steps: int | None = None
    poll_ms: int = 500
    seed: int = 0
    threads: int = 0  # torch threads per rank (0: cores / ranks)
    train_on_rolled_back: bool = False  # learn from samples of versions a canary trial rolled back
    batch_invariant: bool = False  # kernels.batch_invariant in the model: a row's logprobs never depend on its batch
    metrics_port: int = 0
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    rewards: RewardTable = field(default_factory=RewardTable)
    rollouts: RolloutConfig = field(default_factory=RolloutConfig)
    offpeak: OffPeakConfig | None = None  # borrow serving replicas for rollouts while user load is low
    retry: RetryConfig = field(default_factory=RetryConfig)  # backoff of transient failures (Kafka, HTTP, disk)
    announce_timeout_s: float = 15.0  # one attempt to put a new version on the weights topic


class TrainerMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.events = Counter("flywheel_trainer_events", "Stream events by outcome", ["outcome"], registry=r)
        self.samples = Counter("flywheel_trainer_samples", "Samples trained, by source", ["source"], registry=r)
        self.dropped = Counter(
            "flywheel_trainer_dropped", "Samples dropped before training, by reason", ["reason"], registry=r
        )
        self.reward = Gauge(
            "flywheel_trainer_reward_mean", "Mean reward of trained samples, by version", ["version"], registry=r
        )
        self.acceptance = Gauge(
            "flywheel_trainer_acceptance", "Share of user samples accepted, by version", ["version"], registry=r
        )
        self.kl = Gauge("flywheel_trainer_kl_per_token", "k1 KL to the reference, per token", registry=r)
        self.mismatch = Gauge(
            "flywheel_trainer_logprob_mismatch_max", "Max |trainer - behaviour| logprob in the last batch", registry=r
        )
        self.step_time = Histogram(
            "flywheel_trainer_step_seconds",
            "Update step time",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tokens_per_s = Gauge("flywheel_trainer_tokens_per_s", "Trained tokens per second, last step", registry=r)
        self.version = Gauge("flywheel_trainer_published_version", "Newest version published", registry=r)
        self.step = Gauge("flywheel_trainer_step", "Updates done", registry=r)
        self.failures = Counter(
            "flywheel_trainer_failures",
            "Failures the daemon lived through, by stage "
            "(ingest, sample, update, rollout_http, rollout_group, publish, announce) and cause",
            ["stage", "cause"],
            registry=r,
        )
        r.register(sandbox.CONTAINED)  # flywheel_sandbox_contained_total{kind}: reward hacking, contained


class Trainer:
    def __init__(self, cfg: TrainerConfig):
        self.cfg = cfg
        self.rank, self.world = world()
        torch.manual_seed(cfg.seed)
        bi.set_enabled(cfg.batch_invariant)
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // self.world))
        self.work = Path(cfg.work_dir)
        self.checkpoints = Checkpoints(self.work)
        self.ref = load_pretrained(cfg.model_dir).eval() if cfg.loss.kl_coef else None
        if self.ref is not None:
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.model = load_pretrained(cfg.model_dir).train()
        self.opt = make_optimizer(self.model, cfg.optim)
        self.joiner = Joiner(cfg.join, cfg.rewards, text_len=self._text_len())
        self.buffer: list[Sample] = []
        self.offsets: dict[str, int] = {}  # "topic:partition" -> next offset to read
        self.step = 0
        self.version = 0  # the newest published version (samples are judged stale against it)
        self.baseline = 0.0
        self.last_publish = time.monotonic()
        self.published_step: int | None = None  # the step the newest version holds (None: not yet, this run)
        self.trained_since_ckpt: list[dict] = []
        self.history: dict[str, dict] = {}  # version -> reward/acceptance sums for the plot
        self.rolled_back: set[int] = set()  # versions a canary trial rolled back (weights topic)
        self.metrics = TrainerMetrics()
        self.failures = Failures(self.metrics.failures, cfg.retry)
        self.rollouts = RolloutSource(cfg.rollouts, self.failures)
        if cfg.rollouts.tasks_per_step and cfg.rollouts.gateway_url and self.rank == 0:
            sandbox.check(cfg.rollouts.sandbox)  # no isolation, no rollouts: refuse to start, say why
        self.pending_announcements: list[dict] = []  # published to the store, not yet on the weights topic
        if cfg.publish_store is not None and self.rank == 0 and cfg.kafka_bootstrap:
            from weight_sync.publish import unannounced

            # A trainer killed between committing a version and announcing it: announce it now, first.
            self.pending_announcements = unannounced(self._publish_config())
        self._control_key = None
        if cfg.publish_key is not None and Path(cfg.publish_key).exists():
            from weight_sync.manifest import load_private

            self._control_key = load_private(cfg.publish_key).public_key()
        self._control_guard = control.ReplayGuard()
        self._consumer = None
        self._resume()

    def _text_len(self):
        from tokenizers import Tokenizer

        path = Path(self.cfg.model_dir) / "tokenizer.json"
        if not path.exists():
            return None
        tok = Tokenizer.from_file(str(path))
        return lambda ids: len(tok.decode(ids))

    # ------------------------------------------------------------------ checkpoint (exactly once)
    def _latest(self) -> Path | None:
        return self.checkpoints.latest()

    def _resume(self) -> None:
        state = self.checkpoints.load()
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.joiner.load_state(state["joiner"])
        self.buffer = [Sample.from_state(d) for d in state["buffer"]]
        self.offsets = state["offsets"]
        self.step, self.version, self.baseline = state["step"], state["version"], state["baseline"]
        self.history = state.get("history", {})
        self.rolled_back = set(state.get("rolled_back", []))
        self._control_guard = control.ReplayGuard(state.get("control_seq", 0))
        done = [int(p.parent.name.split("-")[1]) for p in (self.work / "published").glob("step-*/PUBLISHED")]
        if self.step in done:  # the checkpoint's weights are already a version
            self.published_step = self.step
        if self.rank == 0:
            log.info(
                "resumed at step %d (version %d, %d buffered samples) from %s",
                self.step,
                self.version,
                len(self.buffer),
                self.checkpoints.latest(),
            )

    def save(self) -> None:
        """Everything needed to continue, committed as one new checkpoint (online_rl.checkpoints); then
        the Kafka offsets it holds are committed to the group too."""
        if self.rank != 0:
            return
        self.checkpoints.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "joiner": self.joiner.state(),
                "buffer": [b.state() for b in self.buffer],
                "offsets": dict(self.offsets),
                "step": self.step,
                "version": self.version,
                "baseline": self.baseline,
                "history": self.history,
                "rolled_back": sorted(self.rolled_back),
                "control_seq": self._control_guard.last,
            },
            self.step,
            self.trained_since_ckpt,
        )
        self.trained_since_ckpt = []
        self._commit_offsets()

    def _save_or_retry(self) -> bool:
        """save(), living through a checkpoint disk that is full or failing: nothing is committed (the offsets
        neither), the steps since the last checkpoint stay in memory, and the next save tries again."""
        if not self.failures.ready("checkpoint"):
            return False
        try:
            self.save()
        except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
            self.failures.failed("checkpoint", e, retry=True)
            return False
        self.failures.succeeded("checkpoint")
        return True

    def _commit_offsets(self) -> None:
        if self._consumer is None or not self.offsets:
            return
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        offsets = {}
        for key, offset in self.offsets.items():
            topic, partition = key.rsplit(":", 1)
            offsets[TopicPartition(topic, int(partition))] = OffsetAndMetadata(offset, "", -1)
        try:
            self._consumer.commit(offsets)
        except Exception as e:  # the checkpoint holds the offsets; a failed commit only delays monitoring
            log.warning("offset commit failed (%s); the checkpoint's offsets stay authoritative", e)

    # ------------------------------------------------------------------ ingest
    def consumer(self):
        if self._consumer is None and self.cfg.kafka_bootstrap:
            from kafka import KafkaConsumer, TopicPartition

            from flywheel.core.kafka_admin import ensure_topics

            ensure_topics(self.cfg.kafka_bootstrap)  # weights too: a rollback announced later must reach us
            c = KafkaConsumer(
                bootstrap_servers=self.cfg.kafka_bootstrap,
                group_id=self.cfg.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id="flywheel-trainer",
                max_poll_records=2000,
            )
            try:
                parts = []
                for topic in (ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_WEIGHTS):
                    ids = c.partitions_for_topic(topic)
                    deadline = time.monotonic() + 10
                    while not ids and time.monotonic() < deadline:  # auto-created on first use
                        c.topics()
                        time.sleep(0.2)
                        ids = c.partitions_for_topic(topic)
                    parts += [TopicPartition(topic, p) for p in sorted(ids or [])]
                c.assign(parts)
                committed = {tp: c.committed(tp) for tp in parts}
                for tp in parts:
                    key = f"{tp.topic}:{tp.partition}"
                    if key in self.offsets:  # the checkpoint decides, not the group's committed offset
                        c.seek(tp, self.offsets[key])
                    elif committed[tp] is not None:
                        c.seek(tp, committed[tp])
                    else:
                        c.seek_to_beginning(tp)
            except BaseException:
                c.close()  # a half-made consumer holds sockets: the next try makes a new one
                raise
            self._consumer = c
        return self._consumer

    def ingest(self) -> int:
        if not self.failures.ready("ingest"):
            time.sleep(self.cfg.poll_ms / 1000)
            return 0
        try:
            c = self.consumer()
            if c is None:
                return 0
            batch = c.poll(timeout_ms=self.cfg.poll_ms)
        except Exception as e:  # the broker is away: keep training what is buffered, try again later
            self.failures.failed("ingest", e, retry=True)  # backoff whatever the cause: never a hot loop
            return 0
        self.failures.succeeded("ingest")
        n = 0
        for tp, records in batch.items():
            for r in records:
                if tp.topic == ev.TOPIC_WEIGHTS:
                    self._weights_record(r.value)
                else:
                    self.buffer.extend(self.joiner.add_raw(r.value))
                self.offsets[f"{tp.topic}:{tp.partition}"] = r.offset + 1
                n += 1
        self.joiner.expire(None if n else time.time())  # caught up: let wall time age the windows
        s = self.joiner.stats
        for outcome in (
            "consumed",
            "duplicates",
            "joined",
            "no_signal",
            "orphan_feedback",
            "rollout_events",
            "bad_records",
            "extra_feedback",
            "session_feedback",
            "session_turns",
            "orphan_session_feedback",
        ):
            counter = self.metrics.events.labels(outcome)
            counter.inc(max(0, getattr(s, outcome) - counter._value.get()))
        return n

    def _weights_record(self, raw: bytes) -> None:
        """A canary trial that rolled a version back: its samples stop feeding updates (they remain signals
        about that version in the stream and the metrics). Only records signed by our key count."""
        if self._control_key is None:
            return  # no key to verify with (a trainer that does not publish): nothing to act on
        try:
            record = self._control_guard.check(control.decode(raw, self._control_key))
        except control.ControlError as e:
            self.failures.failed("control_record", e, retry=False)
            return
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
        return s.problem(c.vocab_size, c.num_hidden_layers, c.num_experts_per_tok, c.num_experts)

    def _invalid(self, s: Sample, problem: str) -> None:
        self.metrics.dropped.labels("invalid").inc()
        self.failures.failed("sample", InvalidSample(f"{s.key}: {problem}"), retry=False)
        if s.source == "user":
            self.trained_since_ckpt.append({"key": s.key, "events": list(s.event_ids), "dropped": "invalid"})

    def _take_batch(self) -> list[Sample]:
        fresh, batch = [], []
        for s in self.buffer:
            if (problem := self._problem(s)) is not None:
                self._invalid(s, problem)
            elif s.model_version in self.rolled_back and not self.cfg.train_on_rolled_back:
                self.metrics.dropped.labels("rolled_back").inc()
                self.trained_since_ckpt.append({"key": s.key, "events": list(s.event_ids), "dropped": "rolled_back"})
            elif self.version - s.model_version > self.cfg.staleness:
                self.metrics.dropped.labels("stale").inc()
                self.trained_since_ckpt.append({"key": s.key, "events": list(s.event_ids), "dropped": "stale"})
            else:
                fresh.append(s)
        batch, self.buffer = fresh[: self.cfg.batch_size], fresh[self.cfg.batch_size :]
        return batch

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
        samples = self._take_batch() + valid_rollouts
        samples = [s for s in samples if s.n_tokens > 0]
        if not samples:
            return None
        try:
            adv, self.baseline = advantages(samples, self.cfg.loss, self.baseline)
            share_batch(samples, adv)
            m = update(self.model, self.ref, self.opt, samples, adv, self.cfg.loss, self.cfg.optim)
        except Exception as e:  # a batch the checks let through and the update cannot take: skip it, go on
            if self.world > 1:
                raise  # the other ranks are inside the update's collectives: skipping alone would hang them
            self.failures.failed("update", e, retry=False)
            self.opt.zero_grad(set_to_none=True)
            for s in samples:
                if s.source == "user":
                    self.trained_since_ckpt.append(
                        {"key": s.key, "events": list(s.event_ids), "dropped": "update_failed"}
                    )
            return None
        self.step += 1
        for s in samples:
            self.metrics.samples.labels(s.source).inc()
            if s.source == "user":
                self.trained_since_ckpt.append({"key": s.key, "events": list(s.event_ids)})
                h = self.history.setdefault(str(s.model_version), {"n": 0, "reward": 0.0, "accepted": 0})
                h["n"] += 1
                h["reward"] += s.reward
                h["accepted"] += int(s.reward > 0)
        if pass_rates:
            h = self.history.setdefault(str(self.version), {"n": 0, "reward": 0.0, "accepted": 0})
            h["rollout_tasks"] = h.get("rollout_tasks", 0) + len(pass_rates)
            h["rollout_pass"] = h.get("rollout_pass", 0.0) + sum(pass_rates)
        for v, h in self.history.items():
            if h["n"]:
                self.metrics.reward.labels(v).set(h["reward"] / h["n"])
                self.metrics.acceptance.labels(v).set(h["accepted"] / h["n"])
        self.metrics.kl.set(m["kl_per_token"])
        self.metrics.mismatch.set(m["logprob_mismatch_max"])
        self.metrics.step_time.observe(m["step_s"])
        self.metrics.tokens_per_s.set(m["tokens_per_s"])
        self.metrics.step.set(self.step)
        m.update(
            step=self.step,
            user=sum(s.source == "user" for s in samples),
            rollout=len(rollouts),
            rollout_pass=float(np.mean(pass_rates)) if pass_rates else None,
        )
        return m

    # ------------------------------------------------------------------ publish
    def _publish_config(self):
        from weight_sync.publish import PublishConfig

        return PublishConfig(
            store=self.cfg.publish_store,
            private_key=self.cfg.publish_key,
            kafka_bootstrap=self.cfg.kafka_bootstrap,
            store_url=self.cfg.publish_store_url,
            canary=self.cfg.publish_canary,
        )

    def publish(self) -> int | None:
        """The current weights as the next version in the store; its announcement follows (announce())."""
        if self.cfg.publish_store is None or self.rank != 0:
            return None
        from weight_sync.publish import publish
        from weight_sync.store import Store

        pcfg = self._publish_config()
        if Store(self.cfg.publish_store).latest() is None:
            # v0 = the starting model, the version the fleet serves first
            self.pending_announcements.append(publish(self.cfg.model_dir, pcfg, announce_now=False).announcement)
        out = self.work / "published" / f"step-{self.step:08d}"
        shutil.rmtree(out, ignore_errors=True)
        save_pretrained(self.model, out, torch.bfloat16)
        for name in SIDE_FILES:
            if name != "config.json" and (Path(self.cfg.model_dir) / name).exists():
                shutil.copyfile(Path(self.cfg.model_dir) / name, out / name)
        shutil.copyfile(Path(self.cfg.model_dir) / "config.json", out / "config.json")  # the served config, as is
        result = publish(out, pcfg, announce_now=False)
        self.pending_announcements.append(result.announcement)
        self.version = result.version
        self.published_step = self.step
        (out / "PUBLISHED").write_text(str(result.version))  # read by _resume: no republishing the same weights
        self.metrics.version.set(self.version)
        self.last_publish = time.monotonic()
        for old in sorted((self.work / "published").glob("step-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("published v%d at step %d (%s, %.1fx)", result.version, self.step, result.kind, result.ratio)
        self.announce()
        try:
            self.plot()
        except Exception as e:  # a figure is not worth a failed publish
            log.warning("reward plot not written: %s", e)
        return result.version

    def announce(self) -> bool:
        """Put published versions on the weights topic, oldest first. One that fails (the broker away)
        stays pending and is retried after backoff; True when nothing is pending."""
        from weight_sync.publish import announce

        while self.pending_announcements and self.failures.ready("announce"):
            try:
                announce(self._publish_config(), self.pending_announcements[0], self.cfg.announce_timeout_s)
            except Exception as e:
                self.failures.failed("announce", e, retry=True)
                return False
            self.pending_announcements.pop(0)
            self.failures.succeeded("announce")
        return not self.pending_announcements

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        versions = sorted(self.history, key=int)
        if not versions:
            return
        acc = [self.history[v]["accepted"] / self.history[v]["n"] if self.history[v]["n"] else np.nan for v in versions]
        rew = [self.history[v]["reward"] / self.history[v]["n"] if self.history[v]["n"] else np.nan for v in versions]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([int(v) for v in versions], acc, "o-", label="acceptance (user samples)")
        ax.plot([int(v) for v in versions], rew, "s--", label="mean reward")
        ax.set_xlabel("model version that produced the samples")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.work / "reward_by_version.png", dpi=100)
        plt.close(fig)

    # ------------------------------------------------------------------ loop
    def run(self, stop=None) -> None:
        if self.cfg.metrics_port and self.rank == 0:
            from prometheus_client import start_http_server

            start_http_server(self.cfg.metrics_port, addr="127.0.0.1", registry=self.metrics.registry)
        scheduler = OffPeakScheduler(self.cfg.offpeak).start() if self.cfg.offpeak and self.rank == 0 else None
        try:
            saved_step = self.step
            while (stop is None or not stop.is_set()) and (
                self.cfg.max_steps is None or self.step < self.cfg.max_steps
            ):
                consumed = self.ingest()
                m = self.train_step()
                if m is not None:
                    log.info(
                        "step %d: %d user + %d rollout samples, %d tokens, %.0f tok/s, kl %.4f%s",
                        m["step"],
                        m["user"],
                        m["rollout"],
                        m["tokens"],
                        m["tokens_per_s"],
                        m["kl_per_token"],
                        f", rollout pass {m['rollout_pass']:.2f}" if m["rollout_pass"] is not None else "",
                    )
                    if self.step % self.cfg.checkpoint_every == 0 and self._save_or_retry():
                        saved_step = self.step
                elif not consumed and self.step != saved_step and self._save_or_retry():
                    saved_step = self.step  # caught up and idle: no trained steps left outside a checkpoint
                # Nothing trained since the last version: publishing the same weights again would only make
                # the fleet switch for nothing.
                if (
                    time.monotonic() - self.last_publish >= self.cfg.publish_interval_s
                    and self.step != self.published_step
                    and self.failures.ready("publish")
                ):
                    if self.step != saved_step and self._save_or_retry():
                        saved_step = self.step
                    try:
                        self.publish()
                        self.failures.succeeded("publish")
                    except Exception as e:  # store or disk trouble: the weights wait for the next try
                        self.failures.failed("publish", e, retry=True)
                self.announce()
            if self.step != saved_step or self.trained_since_ckpt:
                self.save()
        finally:
            if scheduler is not None:
                scheduler.stop()  # every borrowed replica goes back to users
            if self.world > 1:
                share_batch(None, None)  # tells the other ranks to stop
            if self._consumer is not None:
                self._consumer.close()


def worker_loop(trainer: Trainer) -> None:
    """Ranks > 0: take part in every update rank 0 starts, until it sends None."""
    while True:
        samples, adv = share_batch(None, None)
        if samples is None:
            return
        update(trainer.model, trainer.ref, trainer.opt, samples, adv, trainer.cfg.loss, trainer.cfg.optim)
        trainer.step += 1


def _rank_main(rank: int, size: int, port: int, cfg: TrainerConfig) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        trainer = Trainer(cfg)
        if rank == 0:
            trainer.run()
        else:
            worker_loop(trainer)
    finally:
        dist.destroy_process_group()


def run_distributed(cfg: TrainerConfig, nproc: int) -> None:
    """`flywheel train --nproc N`: N ranks over gloo on this machine."""
    import torch.multiprocessing as mp

    from flywheel.core.procs import free_port

    if nproc <= 1:
        Trainer(cfg).run()
        return
    mp.spawn(_rank_main, args=(nproc, free_port(), cfg), nprocs=nproc, join=True)
