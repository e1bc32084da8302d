"""PPO epochs (OptimConfig.epochs): passes over one batch, one optimizer step each; and the distillation in a
step of its own (LossConfig.distill_step)."""

import dataclasses

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig, OptimConfig
from online_rl.data.samples import DISTILL, Sample
from online_rl.model.transformer import MoECoder, token_logprobs
from online_rl.trainer.update import make_optimizer, update
from tests.tiny_models import TINY_MOE


def _model() -> MoECoder:
    m = MoECoder(TINY_MOE)
    m.init_weights(3)
    return m


def _samples(model: MoECoder, n: int = 4) -> list[Sample]:
    """On-policy samples (behaviour logprobs are the model's own) of random sequences."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        prompt = rng.integers(4, TINY_MOE.vocab_size, 3 + i)
        completion = rng.integers(4, TINY_MOE.vocab_size, 4)
        seq = torch.from_numpy(np.concatenate([prompt, completion]))[None]
        with torch.no_grad():
            r = model(seq[:, :-1])
        lp = token_logprobs(r.logits, seq[:, 1:])[0, prompt.size - 1 :].numpy()
        out.append(
            Sample(
                key=f"s{i}",
                prompt_ids=prompt,
                output_ids=completion,
                behaviour_logprobs=lp.astype(np.float32),
                routed_experts=r.experts[0].numpy().astype(np.uint8),
                reward=float(i % 2),
                model_version=0,
            )
        )
    return out


@pytest.mark.parametrize("lr", [1e-5, 1e-2])
def test_two_epochs_are_two_optimizer_steps_on_the_same_batch(lr):
    base = _model()
    samples = _samples(base)
    adv = np.array([-1.0, 1.0, -0.5, 0.5])
    loss = LossConfig(kl_coef=0.0)
    one_by_one = _model()
    opt = make_optimizer(one_by_one, OptimConfig(lr=lr))
    for _ in range(2):
        update(one_by_one, None, opt, samples, adv, loss, OptimConfig(lr=lr))
    together = _model()
    m = update(
        together, None, make_optimizer(together, OptimConfig(lr=lr)), samples, adv, loss, OptimConfig(lr, epochs=2)
    )
    for (k, a), b in zip(one_by_one.state_dict().items(), together.state_dict().values()):
        assert torch.equal(a, b), k
    moved = max((a - b).abs().max().item() for a, b in zip(together.state_dict().values(), base.state_dict().values()))
    assert moved > lr / 2
    # the first pass's metrics: on policy, the trainer scores the logged tokens as they were logged
    assert m["logprob_mismatch_max"] < 1e-4 and m["grad_norm"] > 0
    if lr < 1e-4:  # a small step: the second pass still pulls
        assert m["grad_norm_last"] > 0
    else:  # a large one moved (nearly) every token past the trust region: the second pass has little to pull
        assert m["grad_norm_last"] < 0.1 * m["grad_norm"]


def test_one_epoch_reports_no_second_norm_and_epochs_below_one_are_refused():
    model = _model()
    samples = _samples(model, 2)
    m = update(
        model, None, make_optimizer(model, OptimConfig()), samples, np.array([1.0, -1.0]), LossConfig(), OptimConfig()
    )
    assert "grad_norm_last" not in m and m["tokens"] == 8
    with pytest.raises(ValueError, match="epochs"):
        OptimConfig(epochs=0)


def _with_hints(samples: list[Sample]) -> list[Sample]:
    """The first sample commented on (a hint), the second a fresh student sample of its context."""
    hint = np.array([11, 12, 13], np.int64)
    return [
        dataclasses.replace(samples[0], hint_ids=hint),
        dataclasses.replace(samples[1], key="s0/distill0", source=DISTILL, reward=0.0, hint_ids=hint),
        *samples[2:],
    ]


def test_the_distillation_step_comes_after_the_policy_gradient_passes_and_alone():
    samples = _with_hints(_samples(_model()))
    adv = np.array([-1.0, 0.0, -0.5, 0.5])
    loss = LossConfig(kl_coef=0.05, distill_coef=1.0, distill_step=True)
    optim = OptimConfig(lr=1e-5, epochs=2)
    own = _model()
    m = update(own, _model(), make_optimizer(own, optim), samples, adv, loss, optim)
    # the same by hand: two passes of the policy gradient without the fresh sample or the distillation, then one
    # step over the hinted samples with advantages 0
    by_hand = _model()
    opt = make_optimizer(by_hand, optim)
    pg = [0, 2, 3]
    no_distill = dataclasses.replace(loss, distill_coef=0.0, distill_step=False)
    for _ in range(2):
        update(by_hand, _model(), opt, [samples[i] for i in pg], adv[pg], no_distill, OptimConfig(lr=1e-5))
    update(
        by_hand,
        _model(),
        opt,
        samples[:2],
        np.zeros(2),
        dataclasses.replace(loss, distill_step=False),
        OptimConfig(lr=1e-5),
    )
    for (k, a), b in zip(own.state_dict().items(), by_hand.state_dict().values()):
        assert torch.equal(a, b), k
    assert m["distill_tokens"] == 8 and m["distill_kl_per_token"] > 0 and m["grad_norm_distill"] > 0


def test_without_a_hint_or_a_coefficient_the_distillation_step_is_not_taken():
    samples = _samples(_model())
    adv = np.array([-1.0, 1.0, -0.5, 0.5])
    for loss, batch in (
        (LossConfig(distill_step=True), samples),  # no hint in the batch
        (LossConfig(distill_coef=0.0, distill_step=True), _with_hints(samples)),  # distillation off
    ):
        on, off = _model(), _model()
        m = update(on, None, make_optimizer(on, OptimConfig()), batch, adv, loss, OptimConfig())
        update(
            off,
            None,
            make_optimizer(off, OptimConfig()),
            batch,
            adv,
            dataclasses.replace(loss, distill_step=False),
            OptimConfig(),
        )
        assert "grad_norm_distill" not in m
        for a, b in zip(on.state_dict().values(), off.state_dict().values()):
            assert torch.equal(a, b)


def test_each_steps_gradient_norm_is_exported_and_a_step_not_taken_leaves_no_series():
    from online_rl.data.join import JoinStats
    from online_rl.trainer.metrics import TrainerMetrics

    metrics = TrainerMetrics(JoinStats)
    norm = lambda step: metrics.registry.get_sample_value("flywheel_trainer_grad_norm", {"step": step})  # noqa: E731
    samples, adv = _with_hints(_samples(_model())), np.array([-1.0, 0.0, -0.5, 0.5])
    model, optim = _model(), OptimConfig(lr=1e-5, epochs=2)
    opt = make_optimizer(model, optim)
    m = update(model, _model(), opt, samples, adv, LossConfig(distill_coef=1.0, distill_step=True), optim)
    metrics.trained({}, m)
    assert (norm("first"), norm("last"), norm("distill")) == (
        m["grad_norm"],
        m["grad_norm_last"],
        m["grad_norm_distill"],
    )
    assert min(norm("first"), norm("last"), norm("distill")) > 0
    m = update(model, _model(), opt, samples, adv, LossConfig(), OptimConfig(lr=1e-5))  # one pass, no own step
    metrics.trained({}, m)
    assert norm("first") == m["grad_norm"] and norm("last") is None and norm("distill") is None
