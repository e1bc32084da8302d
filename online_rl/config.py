"""The trainer's configuration, one dataclass per part, as the one source of its options (infra.config):
each option's default, help and environment variable is written here once, and `flywheel train`'s flags
are generated from it. Torch-free, so that building the command line stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.config import check_modes, nested, option
from online_rl.offpeak import OffPeakConfig
from online_rl.sandbox.judge import SandboxConfig
from online_rl.trainer.failures import RetryConfig


@dataclass
class RewardTable:
    """Rewards for user signals (default like Cursor Tab: +0.75 accept, -0.25 reject), and how persistence
    changes them: reward = (1 - persist_weight) * immediate + persist_weight * (kept | deleted). The defaults
    order them accepted and kept (0.875) > accepted then deleted (0.125) > ignored (no sample: 0) > rejected
    (-0.25); a table that breaks that order is refused."""

    accept: float = 0.75
    reject: float = -0.25
    partial_floor: float = 0.0  # a partial accept of none of the text; scales to `accept` for all of it
    kept: float = 1.0  # an accepted completion still in the file when checked (edit_distance 0)
    deleted: float = -0.5  # one the user deleted since
    persist_weight: float = 0.5  # the share of the reward the persistence check decides
    # Verdicts the gateway reads from agent sessions whose clients send no feedback (serving.signals.implicit).
    # Tests passing after an edit is the strongest evidence an agent client gives, but weaker than a user's
    # accept (the agent ran its own tests, which may be few); a correction or a revert is the user's word
    # against the turn, as strong as a reject plus the cost of the turn; a repeat or an abandoned task may
    # have other causes (a flaky network, a user called away): the mildest.
    signals: dict = field(
        default_factory=lambda: {
            "tests_pass": 0.5,
            "tests_fail": -0.25,
            "revert": -0.5,
            "correction": -0.5,
            "repeat": -0.25,
            "abandoned": -0.25,
        }
    )

    def signal(self, name: str) -> float:
        if name not in self.signals:
            raise ValueError(f"no reward for signal {name!r}; RewardTable.signals has {sorted(self.signals)}")
        return self.signals[name]

    def __post_init__(self):
        w = self.persist_weight
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"persist_weight must be in [0, 1], got {w}")
        kept, deleted = self.combined(self.accept, True), self.combined(self.accept, False)
        if not self.reject < 0.0 < self.accept or (w > 0 and not kept > deleted > 0.0):
            raise ValueError(
                "rewards must order accepted and kept > accepted then deleted > ignored (0) > rejected; "
                f"this table gives {kept:g} > {deleted:g} > 0 > {self.reject:g}"
            )

    def combined(
        self, immediate: float, still_present: bool, edit_distance: int | None = None, total_chars: int | None = None
    ) -> float:
        """An immediate reward after its persistence check: an edited completion counts as kept in the share
        of its characters the user did not change."""
        keep = self.kept if still_present else self.deleted
        if still_present and edit_distance and total_chars:
            frac = max(0.0, 1.0 - edit_distance / total_chars)
            keep = self.deleted + frac * (self.kept - self.deleted)
        return (1.0 - self.persist_weight) * immediate + self.persist_weight * keep

    def reward(
        self, kind: str, accepted_chars: int | None = None, total_chars: int | None = None, score: float | None = None
    ) -> float:
        """score: a session's partial outcome in [0, 1], in place of the share of characters kept."""
        if kind == "accept":
            return self.accept
        if kind == "reject":
            return self.reject
        if kind == "partial":
            if score is not None:
                frac = min(1.0, max(0.0, float(score)))
            else:
                frac = (
                    0.5
                    if not total_chars or accepted_chars is None
                    else min(1.0, max(0.0, accepted_chars / total_chars))
                )
            return self.partial_floor + frac * (self.accept - self.partial_floor)
        raise ValueError(f"unknown feedback kind {kind!r}")


@dataclass
class LengthPenalty:
    """Composer 2's concave penalty on the token count: reward - coef * n ** power, 0 < power <= 1."""

    coef: float = 0.0
    power: float = 0.5

    def __call__(self, n_tokens: int) -> float:
        return self.coef * float(n_tokens) ** self.power


@dataclass
class JoinConfig:
    # Which signals make a sample's reward (online_rl.data.join): basic = accept | reject | partial when shown;
    # persist = also whether accepted code is still in the file (persisted); text = also the user's comments
    # (a hint for text-feedback distillation, online_rl.trainer.loss).
    signals: Literal["basic", "persist", "text"] = option(
        "basic",
        flag="feedback",
        help="signals learned from: basic (accept/reject), persist (+ kept), text (+ comments)",
    )
    # Under persist | text, a judged completion waits this long (stream time) for its delayed signal: its
    # persisted check when accepted, a comment when rejected (text); then it is trained on what it has.
    delayed_window_s: float = option(
        1800.0, flag="delayed-window", help="seconds an accepted completion waits for its persisted check"
    )
    # A rejected one (text) waits only this long for a comment: users comment as they reject, and its
    # negative reward should not wait the persistence window. A comment after it joins nothing (late).
    comment_wait_s: float = option(120.0, flag="comment-wait", help="seconds a rejected completion waits for a comment")
    window_s: float = 120.0
    orphan_wait_s: float = 60.0
    session_window_s: float = 900.0  # an agent session's turn waits this long for feedback (its own or its session's)
    turn_discount: float = 1.0  # turn k of K gets the session outcome times turn_discount ** (K - 1 - k)
    dedupe_capacity: int = 1_000_000  # event ids remembered
    max_hint_tokens: int = 128  # a longer comment joins without a hint (the teacher's context stays bounded)

    def __post_init__(self):
        check_modes(self)
        for name in ("delayed_window_s", "comment_wait_s", "window_s", "orphan_wait_s", "session_window_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class LossConfig:
    is_cap: float = 2.0  # C: importance weights above it are truncated
    clip_low: float = 0.2  # PPO trust region against the behaviour policy: a token with A < 0 whose ratio
    clip_high: float = 0.28  # fell under 1 - clip_low (A > 0: rose over 1 + clip_high) gets no more gradient
    kl_coef: float = option(0.05, flag="kl", help="beta: weight of the k2 KL penalty to the starting model")
    # gamma. Measured (benchmarks.learning, seeds 0 and 1; docs/trainer.md): at 1.0 the distillation's gradient swamped
    # the
    # policy gradient (seed 1: an update's norm median 7.8 against 2.1 without comments) and AdamW followed it: the
    # tasks nobody had commented on learned slower, and text fell behind persist (mean evaluation 0.769 and 0.783
    # against 0.811 and 0.802). At 0.03 it kept pace (0.811, 0.817); no value was ahead by more than the noise.
    # 0 turns the sampling and the teacher's forwards off (their cost, for no measured gain here).
    distill_coef: float = option(
        0.03, flag="distill", help="weight of the text-feedback distillation KL (samples with a user's comment)"
    )
    # The distillation in an optimizer step of its own, after the policy gradient's: its own gradient clip, so
    # that neither term swamps the other (in one loss, gamma trades them against each other; AdamW's state is
    # shared). Measured (benchmarks.learning --distill-step, docs/trainer.md): worth about one more policy-gradient
    # pass.
    distill_step: bool = option(
        False, help="the distillation KL in an optimizer step of its own, after the policy gradient's"
    )
    distill_samples: int = option(
        8, help="fresh completions of a commented context by the current model that the distillation KL also scores"
    )
    distill_max_tokens: int = 64  # the longest of those completions
    distill_updates: int = option(
        1, help="updates in which a commented context is sampled again and distilled (the student as it is then)"
    )
    # Commented contexts sampled per update at most (the rest wait, new ones first): sampling has no KV cache,
    # and unbounded it starved the live demo's trainer (text: 4-6 updates a version against persist's 33).
    distill_contexts: int = option(2, help="commented contexts sampled again per update at most (the rest wait)")
    distill_backlog: int = 256  # contexts that wait at most (beyond: dropped, those already sampled first)
    length_penalty: LengthPenalty = field(default_factory=LengthPenalty)
    group_std: bool = False  # divide group advantages by the group's std (GRPO); off: Dr.GRPO-style
    baseline_momentum: float = 0.9  # of each running baseline of user rewards (one per Sample.baseline)
    router_replay: bool = True

    def __post_init__(self):
        counts = (self.distill_max_tokens, self.distill_updates, self.distill_contexts)
        if self.distill_samples < 0 or self.distill_backlog < 0 or min(counts) < 1:
            raise ValueError(
                f"distill_samples and distill_backlog must be >= 0, distill_max_tokens, distill_updates and "
                f"distill_contexts >= 1, got {self.distill_samples}, {self.distill_backlog}, {counts}"
            )
        if self.distill_coef < 0:  # it would push the student away from the teacher
            raise ValueError(f"distill_coef must be >= 0, got {self.distill_coef}")


@dataclass
class OptimConfig:
    lr: float = option(3e-5, help="AdamW learning rate")
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0
    micro_batch: int = 16  # sequences per forward, to bound activation memory
    # PPO's epochs: each pass one optimizer step on the same batch; the loss's trust region against the behaviour
    # policy (clip_low/clip_high) stops a token's gradient once a pass has moved it far enough. Measured
    # (benchmarks.learning, docs/trainer.md): 2 passes reached 90% with 0.57-0.72x the judged requests of 1, every
    # variant.
    # 1 here all the same: the live demo was not measured with 2, and its trainer shares two cores with serving.
    epochs: int = option(1, help="passes over each batch, one optimizer step each (PPO epochs)")

    def __post_init__(self):
        if self.epochs < 1 or self.micro_batch < 1:
            raise ValueError(f"epochs and micro_batch must be >= 1, got {self.epochs}, {self.micro_batch}")


@dataclass
class RolloutConfig:
    gateway_url: str | None = option(
        None, flag="gateway", env="FLYWHEEL_GATEWAY_URL", help="gateway for rollouts (its admin path)"
    )
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the gateway's admin token (environment only)"
    )
    tasks_per_step: int = option(0, flag="rollout-tasks", help="sandbox tasks per update (0: user feedback only)")
    group_size: int = 8
    temperature: float = 1.0
    max_tokens: int = 40
    min_tokens: int = 0  # >0: no end-of-text before this many tokens (long rollouts, e.g. to measure a return)
    task_seed: int = 0
    # borrowed: only replicas the off-peak scheduler lent (none lent: no rollouts); `flywheel train --offpeak` sets it
    replicas: Literal["any", "borrowed"] = "any"
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # Mined tasks (online_rl.tasks.mining, `flywheel tasks mine`) in the mixture: each task of a step is a mined one
    # with probability mined_share, drawn from the tasks.jsonl files under mined_tasks.
    mined_tasks: Path | None = option(None, help="a tasks.jsonl, or a folder of them, to draw mined rollout tasks from")
    mined_share: float = option(0.0, help="share of rollout tasks drawn from the mined ones (0: synthetic only)")
    mined_prompt_chars: int = 2000  # a mined task's prompt: the end of the file above the body, this long at most
    # A mined task's tests run in the candidate's own interpreter (the repository's tests import its code), so a
    # candidate can make them pass without doing the work (patch unittest, read the test file): its reward is not
    # an honest evaluator's as a synthetic task's is (docs/sandbox.md). Training on them is asked for by name.
    mined_rewards_forgeable_ok: bool = option(
        False,
        help="train on mined tasks although a candidate can forge their reward (their tests share its process)",
    )

    def __post_init__(self):
        check_modes(self)
        if self.mined_share > 0 and not self.mined_rewards_forgeable_ok:
            raise ValueError(
                "mined rollout tasks (--mined-share) are judged by tests that run in the candidate's own process, "
                "which it can game; say --mined-rewards-forgeable-ok to train on them anyway (docs/sandbox.md)"
            )


@dataclass
class PublisherConfig:
    store: Path | None = option(None, help="weights store to publish into (none: do not publish)")
    key: Path | None = option(
        None, help="signing key; also verifies control records (`flywheel train`: $FLYWHEEL_HOME/weights/keys)"
    )
    store_url: str | None = option(None, env="FLYWHEEL_STORE_URL", help="where agents fetch the store from")
    s3_url: str | None = option(
        None,
        env="FLYWHEEL_S3_URL",
        help="also publish to this bucket (s3://BUCKET/PREFIX; endpoint, credentials: AWS_*); agents fetch there",
    )
    canary: bool = option(
        False, help="announce new versions as canary candidates (flywheel weights canary judges them)"
    )
    gate: bool = option(
        False,
        help="leave new versions unannounced for the eval gate (`flywheel gate --follow` judges and announces them)",
    )
    interval_s: float = option(3600.0, flag="publish-interval", help="seconds between published versions")
    announce_timeout_s: float = option(
        15.0, flag="announce-timeout", help="seconds one attempt to announce a version may take"
    )


@dataclass
class ShardConfig:
    """How the model is spread over the ranks (online_rl.trainer.sharding)."""

    shard: Literal["dp", "fsdp"] = option(
        "dp", help="dp: a whole model and optimizer per rank; fsdp: FSDP2 shards parameters, gradients, optimizer"
    )
    # FSDP2's mixed precision: the dtype blocks compute in (auto: bfloat16 on GPUs; float32 on CPU, where
    # bf16 matmuls are no faster and one-rank parity is what the tests check). Gradients are reduced in
    # float32; the sharded master weights and the optimizer state stay float32 in every case.
    param_dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", flag="fsdp-param-dtype", help="FSDP2 compute dtype (auto: bfloat16 on GPUs, float32 on CPU)"
    )

    def __post_init__(self):
        check_modes(self)


@dataclass
class TrainerConfig:
    model_dir: Path  # the starting checkpoint, also the KL reference
    work_dir: Path = Path("trainer")
    kafka_bootstrap: str | None = option(
        None, flag="kafka", env="FLYWHEEL_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"
    )
    group_id: str = option("flywheel-trainer", help="Kafka consumer group")
    batch_size: int = option(32, help="samples per update")
    min_batch: int = option(8, help="fewer buffered samples wait for more (unless rollouts fill the batch)")
    staleness: int = option(4, help="eta: samples produced more than this many versions ago are dropped")
    max_tenant_share: float = option(
        0.25, help="of a batch's places, the most one tenant's user samples take (the rest wait: tenant_share)"
    )
    max_tenant_backlog: int = option(128, help="samples of a tenant over its share that wait (older ones: dropped)")
    checkpoint_every: int = option(1, help="updates between checkpoints (offsets are committed at each)")
    max_steps: int | None = option(None, help="stop after this many updates (none: run until stopped)")
    poll_ms: int = option(500, help="Kafka poll timeout")
    seed: int = 0
    threads: int = option(0, help="torch threads per rank (0: cores / ranks)")
    device: Literal["cpu", "cuda"] = option("cpu", help="where the model trains (cuda: rank r on GPU r, NCCL)")
    train_on_rolled_back: bool = option(False, help="keep learning from samples of versions a canary rolled back")
    batch_invariant: bool = option(
        False, help="batch-invariant kernels in the model (slower; a row's logprobs never depend on its batch)"
    )
    # An agent client's turn carries its whole conversation (Codex: ~11k tokens at the first turn). A micro
    # batch pads to its longest sample, so on CPU the bound is memory: longer samples are counted and skipped
    # (flywheel_trainer_dropped_total{reason="invalid"}; the ledger says why); raise it on a GPU.
    max_sample_tokens: int = option(8192, help="samples longer than this (prompt + output tokens) are not trained")
    metrics_port: int = option(0, help="port of /metrics (0: none)")
    metrics_host: str = option("127.0.0.1", help="address /metrics listens on")
    publish: PublisherConfig = nested(PublisherConfig)
    loss: LossConfig = nested(LossConfig)
    optim: OptimConfig = nested(OptimConfig)
    sharding: ShardConfig = nested(ShardConfig)
    join: JoinConfig = nested(JoinConfig)
    rewards: RewardTable = field(default_factory=RewardTable)
    rollouts: RolloutConfig = nested(RolloutConfig)
    offpeak: OffPeakConfig | None = None  # borrow serving replicas for rollouts while user load is low
    retry: RetryConfig = field(default_factory=RetryConfig)  # backoff of transient failures (Kafka, HTTP, disk)

    def __post_init__(self):
        check_modes(self)


# The production preset "low-change" (docs/trainer.md, "Versions that change little"): a version per update of one
# optimizer step at a small rate, so that most bf16 weights of a version stay bit-identical to the previous one's
# (the trainer's float32 masters keep the steps too small to move a bf16 weight until they add up): the regime the
# delta codec was built for. Measured by benchmarks/_change_vs_learning.py on the test model.
LOW_CHANGE = OptimConfig(lr=1e-5, epochs=1)
LOW_CHANGE_BATCH = 8  # samples an update, and so a version: small, so that versions come often and learning keeps pace


def low_change(model_dir: Path, **overrides) -> TrainerConfig:
    """The low-change preset: `flywheel train --lr LR --epochs 1 --batch-size 8 --min-batch 8 --publish-interval 0`."""
    preset = dict(
        batch_size=LOW_CHANGE_BATCH,
        min_batch=LOW_CHANGE_BATCH,
        optim=OptimConfig(lr=LOW_CHANGE.lr, epochs=LOW_CHANGE.epochs),
        publish=PublisherConfig(interval_s=0.0),
    )
    return TrainerConfig(model_dir=model_dir, **{**preset, **overrides})  # an override wins over the preset
