"""What the trainer learns from: a sample is one completion with its reward, from a user or a rollout."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Sample:
    key: str  # completion_id:choice (user) or rollout id
    prompt_ids: np.ndarray  # (P,) int
    output_ids: np.ndarray  # (N,) int
    behaviour_logprobs: np.ndarray  # (N,) float32: what serving sampled with
    routed_experts: np.ndarray  # (P + N - 1, L, K) uint8: serving's routing, replayed in training
    reward: float
    model_version: int
    source: str = "user"  # user | rollout
    group: str | None = None  # rollouts of one task form a group (group-relative advantages)
    event_ids: tuple = ()  # the events this sample came from (exactly-once accounting)

    @property
    def n_tokens(self) -> int:
        return int(self.output_ids.size)


@dataclass
class RewardTable:
    """Rewards for user signals (default like Cursor Tab: +0.75 accept, -0.25 reject)."""
    accept: float = 0.75
    reject: float = -0.25
    partial_floor: float = 0.0  # a partial accept of none of the text; scales to `accept` for all of it

    def reward(self, kind: str, accepted_chars: int | None = None, total_chars: int | None = None) -> float:
        if kind == "accept":
            return self.accept
        if kind == "reject":
            return self.reject
        if kind == "partial":
            frac = 0.5 if not total_chars or accepted_chars is None else min(1.0, max(0.0, accepted_chars / total_chars))
            return self.partial_floor + frac * (self.accept - self.partial_floor)
        raise ValueError(f"unknown feedback kind {kind!r}")


@dataclass
class LengthPenalty:
    """Composer 2's concave penalty on the token count: reward - coef * n ** power, 0 < power <= 1."""
    coef: float = 0.0
    power: float = 0.5

    def __call__(self, n_tokens: int) -> float:
        return self.coef * float(n_tokens) ** self.power
