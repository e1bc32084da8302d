"""The student's fresh completions of a commented context: what serving would log for them, the comment's
hint carried, no reward (advantage 0, the user baseline untouched), and the trainer's check passes them."""

import numpy as np
import pytest
import torch

from online_rl.config import LossConfig
from online_rl.data.distill_samples import student_samples
from online_rl.data.samples import DISTILL, Sample
from online_rl.model.transformer import MoECoder, token_logprobs
from online_rl.trainer.loss import advantages, make_batch, policy_loss
from tests.tiny_models import TINY_MOE

TINY = TINY_MOE
STOP = {0}


@pytest.fixture(scope="module")
def model():
    m = MoECoder(TINY)
    m.init_weights(5)
    return m.train()


def commented(hint=(11, 12, 13)) -> Sample:
    return Sample(
        key="cmpl-1:0",
        prompt_ids=np.array([5, 17, 42, 8], np.int32),
        output_ids=np.array([7, 9], np.int32),
        behaviour_logprobs=np.array([-1.0, -2.0], np.float32),
        routed_experts=np.zeros((5, 2, 2), np.uint8),
        reward=-1.0,
        model_version=3,
        hint_ids=None if hint is None else np.array(hint, np.int64),
    )


def test_fresh_samples_are_what_serving_would_log(model):
    gen = torch.Generator().manual_seed(0)
    out = student_samples(model, commented(), 6, 12, STOP, gen, version=7)
    assert 1 <= len(out) <= 6 and model.training  # left as it was found
    assert len({s.key for s in out}) == len(out)
    for s in out:
        assert s.source == DISTILL and s.reward == 0.0 and s.model_version == 7
        assert np.array_equal(s.hint_ids, [11, 12, 13]) and np.array_equal(s.prompt_ids, [5, 17, 42, 8])
        assert 1 <= s.n_tokens <= 12 and 0 not in s.output_ids.tolist()  # ends before the stop token
        assert s.problem(TINY.vocab_size, TINY.moe_layers, TINY.num_experts_per_tok, TINY.num_experts) is None
        # behaviour logprobs and routes are the model's own on this sequence: on policy, rho = 1
        seq = torch.from_numpy(np.concatenate([s.prompt_ids, s.output_ids]).astype(np.int64))[None]
        with torch.no_grad():
            r = model(seq[:, :-1])
        lp = token_logprobs(r.logits, seq[:, 1:])[0, s.prompt_ids.size - 1 :].numpy()
        np.testing.assert_allclose(s.behaviour_logprobs, lp, atol=1e-5)
        assert np.array_equal(s.routed_experts, r.experts[0].numpy())
    # a fixed generator: the same samples again; another seed: others
    again = student_samples(model, commented(), 6, 12, STOP, torch.Generator().manual_seed(0), version=7)
    assert [s.output_ids.tolist() for s in again] == [s.output_ids.tolist() for s in out]
    other = student_samples(model, commented(), 6, 12, STOP, torch.Generator().manual_seed(1), version=7)
    assert [s.output_ids.tolist() for s in other] != [s.output_ids.tolist() for s in out]


def test_completions_end_where_the_context_does(model):
    window = TINY.max_position_embeddings
    near = commented()
    near.prompt_ids = np.full(window - 3, 5, np.int32)
    out = student_samples(model, near, 4, 50, set(), torch.Generator().manual_seed(0), 0)  # no stop: full length
    assert out and all(s.n_tokens == 3 for s in out)
    near.prompt_ids = np.full(window, 5, np.int32)
    assert student_samples(model, near, 4, 50, set(), torch.Generator().manual_seed(0), 0) == []


@pytest.mark.parametrize("hint, n", [(None, 4), ((), 4), ((11,), 0)])
def test_nothing_without_a_hint_or_a_count(model, hint, n):
    assert student_samples(model, commented(hint), n, 8, STOP, torch.Generator().manual_seed(0), 0) == []


def test_no_reward_no_advantage_and_the_baseline_is_the_users(model):
    user = commented()
    fresh = student_samples(model, user, 4, 8, STOP, torch.Generator().manual_seed(1), 0)
    cfg = LossConfig()
    adv_alone, base_alone = advantages([user], cfg, 0.5)
    adv, base = advantages([user, *fresh], cfg, 0.5)
    assert base == base_alone and adv[0] == adv_alone[0]
    assert np.all(adv[1:] == 0.0)
    # they train the distillation term only: with distillation off their loss is the (zero) k2-free PG term
    batch = make_batch(fresh, adv[1:], teacher=True)
    loss, m = policy_loss(model, None, batch, LossConfig(kl_coef=0.0, distill_coef=0.0), len(fresh))
    assert float(loss.detach()) == 0.0
    loss, m = policy_loss(model, None, batch, LossConfig(kl_coef=0.0), len(fresh))
    assert m["distill_tokens"] == sum(s.n_tokens for s in fresh) and float(loss.detach()) > 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"distill_samples": -1},
        {"distill_max_tokens": 0},
        {"distill_updates": 0},
        {"distill_contexts": 0},
        {"distill_backlog": -1},
        {"distill_coef": -0.1},
    ],
)
def test_config_refuses_counts_that_mean_nothing(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LossConfig(**bad)
