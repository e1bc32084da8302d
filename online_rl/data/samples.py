"""What the trainer learns from: a sample is one completion with its reward, from a user or a rollout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DISTILL = "distill"  # the source of the student's fresh samples of a commented context


class InvalidSample(ValueError):
    """A sample the model cannot be trained on (see Sample.problem)."""


@dataclass
class Sample:
    key: str  # completion_id:choice (user) or rollout id
    prompt_ids: np.ndarray  # (P,) int
    output_ids: np.ndarray  # (N,) int
    behaviour_logprobs: np.ndarray  # (N,) float32: what serving sampled with
    routed_experts: np.ndarray  # (P + N - 1, L, K) uint8: serving's routing, replayed in training
    reward: float
    model_version: int
    source: str = "user"  # user | rollout | distill (online_rl.data.distill_samples: no reward, advantage 0)
    group: str | None = None  # rollouts of one task form a group (group-relative advantages)
    event_ids: tuple = ()  # the events this sample came from (exactly-once accounting)
    session: str = ""  # the agent session of a turn judged by its session's outcome
    hint_ids: np.ndarray | None = (
        None  # (H,) int: a user's comment as the hint line the teacher sees (online_rl.trainer.loss)
    )
    tenant: str = ""  # a user sample's tenant (hashed key id): its privacy policy applies (online_rl.data.tenants)
    ts: float = 0.0  # a user sample's completion event time (0: not known, e.g. a rollout)
    # The running baseline a user sample's advantage is taken against (online_rl.trainer.loss.advantages): "explicit" (a
    # user's own accept or reject), "session" (an agent turn judged by its session's outcome) or "implicit" (a
    # verdict read from its agent session). Apart, because their rewards differ in scale and in who is judged:
    # against the autocomplete users' mean (+0.7 once most is accepted), every implicit reward (+0.5 at most) is
    # pushed down, the good turns with the bad.
    baseline: str = "explicit"

    @property
    def n_tokens(self) -> int:
        return int(self.output_ids.size)

    def problem(
        self, vocab_size: int, num_layers: int, top_k: int, num_experts: int, max_tokens: int | None = None
    ) -> str | None:
        """Why this sample cannot be trained on by a model of these dimensions, or None. One bad event
        (a client's garbage, a serving bug) must cost that sample, never the update or the daemon.
        num_layers: the model's routed layers (cfg.moe_layers); 0 (a dense model) skips the routing checks,
        as there is nothing to replay."""
        p, n = self.prompt_ids.size, self.output_ids.size
        if self.prompt_ids.ndim != 1 or self.output_ids.ndim != 1 or p == 0:
            return "token ids are not two non-empty sequences"
        if max_tokens is not None and p + n > max_tokens:
            return f"{p + n} tokens, more than the trainer takes (max_sample_tokens {max_tokens})"
        ids = np.concatenate([self.prompt_ids, self.output_ids])
        if ids.min() < 0 or ids.max() >= vocab_size:
            return f"token id outside the vocabulary [0, {vocab_size})"
        if self.behaviour_logprobs.shape != (n,) or not np.all(np.isfinite(self.behaviour_logprobs)):
            return "behaviour logprobs missing or not finite"
        if np.any(self.behaviour_logprobs > 1e-3):
            return "behaviour logprob above 0"
        want = (p + n - 1, num_layers, top_k)
        if num_layers and self.routed_experts.shape != want:
            return f"routed experts of shape {tuple(self.routed_experts.shape)}, want {want}"
        if num_layers and self.routed_experts.size and int(self.routed_experts.max()) >= num_experts:
            return f"routed expert id outside [0, {num_experts})"
        if not np.isfinite(self.reward):
            return "reward not finite"
        if self.hint_ids is not None and (
            self.hint_ids.ndim != 1
            or (self.hint_ids.size and not 0 <= self.hint_ids.min() <= self.hint_ids.max() < vocab_size)
        ):
            return f"hint token id outside the vocabulary [0, {vocab_size})"
        return None

    def state(self) -> dict:
        """Tensors and plain values only: checkpoints load with torch.load(weights_only=True)."""
        return {
            "key": self.key,
            "prompt_ids": _tensor(self.prompt_ids),
            "output_ids": _tensor(self.output_ids),
            "behaviour_logprobs": _tensor(self.behaviour_logprobs),
            "routed_experts": _tensor(self.routed_experts),
            "reward": float(self.reward),
            "model_version": int(self.model_version),
            "source": self.source,
            "group": self.group,
            "event_ids": list(self.event_ids),
            "session": self.session,
            "hint_ids": None if self.hint_ids is None else _tensor(self.hint_ids),
            "tenant": self.tenant,
            "ts": float(self.ts),
            "baseline": self.baseline,
        }

    @classmethod
    def from_state(cls, d: dict) -> "Sample":
        return cls(
            key=d["key"],
            prompt_ids=d["prompt_ids"].numpy(),
            output_ids=d["output_ids"].numpy(),
            behaviour_logprobs=d["behaviour_logprobs"].numpy(),
            routed_experts=d["routed_experts"].numpy(),
            reward=d["reward"],
            model_version=d["model_version"],
            source=d["source"],
            group=d["group"],
            event_ids=tuple(d["event_ids"]),
            session=d.get("session", ""),
            hint_ids=None if d.get("hint_ids") is None else d["hint_ids"].numpy(),
            tenant=d.get("tenant", ""),  # checkpoints written before tenants have neither
            ts=d.get("ts", 0.0),
            baseline=d.get("baseline", "explicit"),  # checkpoints written before implicit signals
        )


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor of a sample's array: a copy only where it must be one (an event decoded from Kafka is a
    read-only view of its message, which torch.from_numpy would share as a writable tensor, with a warning:
    writes through it would change the event; a strided one is made whole)."""
    return torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous else np.array(a, order="C"))
