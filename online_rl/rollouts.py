"""Sandbox rollouts: held-out tasks sampled on serving replicas (the gateway's admin path), judged by
their hidden tests in the sandbox; each task's samples form one group (group-relative advantages). With a mined
share configured, that share of the tasks are mined from real code (online_rl.tasks.mining.mixture)."""

from __future__ import annotations

import base64
import random
import urllib.error
from collections.abc import Mapping
from typing import Any

import numpy as np

from admin_api.client import AdminClient
from admin_api.types import RolloutAnswer, RolloutRequest
from online_rl.config import RolloutConfig
from online_rl.data.samples import Sample
from online_rl.tasks import synthetic as tasks
from online_rl.tasks.mining import mixture
from online_rl.trainer.failures import Failures


def _local_counter():
    from prometheus_client import Counter

    return Counter(
        "flywheel_rollout_failures", "Rollout failures by stage and cause", ["stage", "cause"], registry=None
    )


class RolloutSource:
    def __init__(self, cfg: RolloutConfig, failures: Failures | None = None):
        self.cfg = cfg
        self.failures = failures or Failures(_local_counter())
        self.tasks = tasks.tasks("heldout", cfg.task_seed)
        self.mixture = None
        if cfg.mined_share > 0:  # none: the synthetic tasks drawn as they always were
            self.mixture = mixture.Mixture(self.tasks, cfg.mined_tasks, cfg.mined_share, cfg.task_seed)
        self.rng = random.Random(cfg.task_seed)
        self.generated = 0
        self.aborted = 0  # samples stopped by a replica's return; their task is redone
        self.retry: list = []

    def _generate(self, prompt: str) -> RolloutAnswer | None:
        body = RolloutRequest(
            prompt=prompt,
            n=self.cfg.group_size,
            max_tokens=self.cfg.max_tokens,
            min_tokens=self.cfg.min_tokens,
            temperature=self.cfg.temperature,
            replicas=self.cfg.replicas,
        )
        try:
            return AdminClient(self.cfg.gateway_url, self.cfg.admin_token).rollouts(body, timeout=300)
        except urllib.error.HTTPError as e:
            if e.code == 503 and self.cfg.replicas == "borrowed":
                return None  # nothing lent right now
            raise

    def samples(self, step: int) -> tuple[list[Sample], list[float]]:
        """One group per task; returns the samples and the pass rate of each task's group. A failed HTTP
        call puts its task back and backs off (transient) or drops the task (not); a group that cannot be
        judged or read is dropped; either way the trainer goes on with what it has."""
        if not self.cfg.tasks_per_step or not self.cfg.gateway_url or not self.failures.ready("rollout_http"):
            return [], []
        out, pass_rates = [], []
        if self.mixture is not None:
            fresh = self.mixture.draw(self.cfg.tasks_per_step)
        else:
            fresh = self.rng.sample(self.tasks, min(self.cfg.tasks_per_step, len(self.tasks)))
        todo, self.retry = (self.retry + fresh)[: self.cfg.tasks_per_step], []
        for i, task in enumerate(todo):
            try:
                resp = self._generate(mixture.prompt_of(task, self.cfg.mined_prompt_chars))
            except Exception as e:
                if self.failures.failed("rollout_http", e):
                    self.retry += todo[i:]  # this task and the rest wait for the backoff
                    break
                continue
            self.failures.succeeded("rollout_http")
            if resp is None:
                self.retry.append(task)
                continue
            try:
                group, rate = self._group(task, resp, step)
            except Exception as e:  # a response we cannot read, or candidates we cannot judge
                self.failures.failed("rollout_group", e, retry=False)
                continue
            if group is None:
                self.retry.append(task)
                continue
            out += group
            pass_rates.append(rate)
        return out, pass_rates

    def _group(self, task, resp: Mapping[str, Any], step: int) -> tuple[list[Sample] | None, float]:
        """Judge one task's samples in the sandbox; None when the replica went back to users mid-rollout."""
        choices = [c for c in resp["choices"] if c["finish_reason"] != "abort"]
        if len(choices) < len(resp["choices"]):
            self.aborted += len(resp["choices"]) - len(choices)
            return None, 0.0
        verdicts = mixture.judge(task, [c["text"] for c in choices], self.cfg.sandbox)
        prompt = np.asarray(resp["prompt_ids"], np.int32)
        out = []
        for c, v in zip(choices, verdicts):
            if not c["output_ids"]:
                continue
            experts = np.frombuffer(base64.b64decode(c["routed_experts"]), np.uint8).reshape(c["routed_experts_shape"])
            out.append(
                Sample(
                    key=f"{resp['id']}-{c['index']}",
                    prompt_ids=prompt,
                    output_ids=np.asarray(c["output_ids"], np.int32),
                    behaviour_logprobs=np.asarray(c["logprobs"], np.float32),
                    routed_experts=experts,
                    reward=v.reward,
                    model_version=int(c["weight_version"] or 0),
                    source="rollout",
                    group=f"{step}/{task.task_id}",
                )
            )
        self.generated += len(choices)
        return out, sum(v.ok for v in verdicts) / max(1, len(verdicts))
