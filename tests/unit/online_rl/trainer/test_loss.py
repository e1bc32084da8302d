"""The policy loss: importance weights, the trust region that stops stale samples pulling, and k2 KL."""

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig
from online_rl.data.samples import Sample
from online_rl.model.transformer import MoECoder, token_logprobs
from online_rl.trainer.loss import make_batch, policy_loss
from tests.tiny_models import TINY_MOE

TINY = TINY_MOE


@pytest.fixture(scope="module")
def model():
    m = MoECoder(TINY)
    m.init_weights(3)
    return m


def sample(model, shift: float) -> Sample:
    """A sample whose logged behaviour logprobs are the model's own minus `shift`: rho = exp(shift)."""
    prompt, out = np.array([5, 17, 42], np.int64), np.array([7, 99, 3, 250], np.int64)
    seq = torch.from_numpy(np.concatenate([prompt, out]))[None]
    with torch.no_grad():
        r = model(seq[:, :-1])
    lp = token_logprobs(r.logits, seq[:, 1:])[0, prompt.size - 1 :].numpy()
    return Sample(
        key="s",
        prompt_ids=prompt,
        output_ids=out,
        behaviour_logprobs=(lp - shift).astype(np.float32),
        routed_experts=r.experts[0].numpy().astype(np.uint8),
        reward=0.0,
        model_version=0,
    )


def grad_norm(model, s: Sample, advantage: float, cfg: LossConfig) -> float:
    model.zero_grad()
    loss, metrics = policy_loss(model, None, make_batch([s], np.array([advantage])), cfg, 1)
    loss.backward()
    return float(sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5), metrics


@pytest.mark.parametrize(
    "advantage, shift, pulls",
    [
        (-0.5, 0.0, True),  # on policy: rho = 1
        (-0.5, np.log(0.5), False),  # A < 0 and the policy already halved these tokens' probability: done
        (-0.5, np.log(1.5), True),  # A < 0, the tokens became likelier: keep pushing down
        (0.5, np.log(2.0), False),  # A > 0 and already twice as likely: done
        (0.5, np.log(0.5), True),  # A > 0, less likely than when sampled: keep pulling up
    ],
)
def test_trust_region_against_the_behaviour_policy(model, advantage, shift, pulls):
    cfg = LossConfig(kl_coef=0.0)
    norm, metrics = grad_norm(model, sample(model, shift), advantage, cfg)
    assert (norm > 1e-6) == pulls, (norm, metrics)
    assert metrics["clipped_share"] == (0.0 if pulls else 1.0)


def test_kl_term_vanishes_at_the_reference_and_pulls_back_elsewhere(model):
    import copy

    s = sample(model, 0.0)
    cfg = LossConfig(kl_coef=1.0)
    ref = copy.deepcopy(model)
    model.zero_grad()
    loss, m = policy_loss(model, ref, make_batch([s], np.array([0.0])), cfg, 1)
    loss.backward()
    assert m["kl_per_token"] == pytest.approx(0.0, abs=1e-6)
    assert all(p.grad is None or p.grad.abs().max() < 1e-6 for p in model.parameters())  # k2: zero at pi = ref
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.lm_head.weight.add_(0.05 * torch.randn_like(moved.lm_head.weight))
    moved.zero_grad()
    loss, m = policy_loss(moved, ref, make_batch([s], np.array([0.0])), cfg, 1)
    loss.backward()
    assert moved.lm_head.weight.grad.abs().max() > 1e-6


# ------------------------------------------------------------------------- text-feedback distillation
def _hinted(model, hint: list[int]) -> Sample:
    s = sample(model, 0.0)
    s.hint_ids = np.array(hint, np.int64)
    return s


def _distill_only(model, s: Sample, coef: float = 1.0):
    """The loss of one sample with a zero advantage: the distillation term alone."""
    cfg = LossConfig(distill_coef=coef)
    return policy_loss(model, None, make_batch([s], np.array([0.0]), teacher=True), cfg, 1)


def test_distillation_is_the_exact_reverse_kl_on_completion_tokens_only(model):
    s = _hinted(model, [11, 12, 13])
    loss, m = _distill_only(model, s)
    # by hand: student rows at the output positions, teacher rows of prompt + hint + output at the same tokens
    p, h = s.prompt_ids.size, 3
    student_seq = np.concatenate([s.prompt_ids, s.output_ids])
    teacher_seq = np.concatenate([s.prompt_ids, s.hint_ids, s.output_ids])
    with torch.no_grad():
        sl = torch.log_softmax(model(torch.from_numpy(student_seq[:-1])[None]).logits[0, p - 1 :], -1)
        tl = torch.log_softmax(model(torch.from_numpy(teacher_seq[:-1])[None]).logits[0, p + h - 1 :], -1)
    want = (sl.exp() * (sl - tl)).sum()
    assert m["distill_tokens"] == s.output_ids.size
    assert loss.item() == pytest.approx(float(want), rel=1e-4) and m["distill_kl_sum"] == pytest.approx(
        float(want), rel=1e-4
    )
    # an empty hint: teacher = student, nothing to learn; no hint at all: no term
    assert _distill_only(model, _hinted(model, []))[0].item() == pytest.approx(0.0, abs=1e-6)
    assert _distill_only(model, sample(model, 0.0))[1]["distill_tokens"] == 0


def test_distillation_moves_the_student_towards_the_hinted_teacher(model):
    import copy

    student = copy.deepcopy(model)
    s = _hinted(student, [11, 12, 13])
    opt = torch.optim.SGD(student.parameters(), lr=0.5)
    before = _distill_only(student, s)[0].item()
    for _ in range(5):
        opt.zero_grad()
        _distill_only(student, s)[0].backward()
        opt.step()
    assert _distill_only(student, s)[0].item() < 0.7 * before  # the KL to the (moving) teacher falls


def test_without_a_coefficient_the_hint_costs_nothing(model):
    s = _hinted(model, [11, 12])
    loss, m = _distill_only(model, s, coef=0.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-6) and m["distill_tokens"] == s.output_ids.size


def test_distillation_of_a_mixed_batch_is_the_sum_of_its_samples(model):
    """Prompts, outputs and hints of different lengths, one sample without a hint: padding and the teacher's
    positions line up with each sample's own."""
    a, b, c = _hinted(model, [11, 12, 13]), sample(model, 0.0), _hinted(model, [40])
    c.prompt_ids, c.output_ids = np.array([5, 17], np.int64), np.array([7, 99], np.int64)
    c.behaviour_logprobs, c.routed_experts = c.behaviour_logprobs[:2], c.routed_experts[:3]
    cfg = LossConfig(distill_coef=1.0)
    alone = [policy_loss(model, None, make_batch([s], np.array([0.0]), teacher=True), cfg, 1)[1] for s in (a, b, c)]
    _, m = policy_loss(model, None, make_batch([a, b, c], np.zeros(3), teacher=True), cfg, 1)
    assert m["distill_tokens"] == a.output_ids.size + c.output_ids.size
    assert m["distill_kl_sum"] == pytest.approx(sum(x["distill_kl_sum"] for x in alone), rel=1e-4)
