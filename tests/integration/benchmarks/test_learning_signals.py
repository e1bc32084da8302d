"""The short version of `python -m benchmarks.learning`: the in-process loop (the trainer serving its own
users, the population reacting, the stream in time order) runs each feedback variant on the test model with
one budget, and the delayed signals really reach the update: persisted checks join and change rewards,
comments become hinted samples whose distillation term trains."""

from __future__ import annotations

import pytest

from benchmarks import learning

pytestmark = pytest.mark.timeout(600)
BUDGET = 64  # judged requests: five updates of each variant, the delayed signals joined (96 took 3 min here)


@pytest.fixture(scope="module")
def runs(test_model, tmp_path_factory):
    cfg = learning.LearningConfig(
        preset="test",
        budget=BUDGET,
        requests_per_round=16,
        window=32,
        eval_samples=1,
        eval_tasks=16,
        min_batch=8,
        progress=False,
    )
    work = tmp_path_factory.mktemp("learning")
    return {v: learning.run_variant(v, cfg, test_model, work) for v in learning.VARIANTS}


def test_every_variant_spends_the_same_budget_of_judged_requests(runs):
    for v, r in runs.items():
        judged = r["reactions"]["accept"] + r["reactions"]["reject"]
        assert judged == BUDGET, v
        assert r["updates"] >= 2 and r["curve"][-1][0] == BUDGET and r["curve"][0][0] == 0
        assert r["users_kept_curve"] and r["users_kept_curve"][0][0] >= 32


def test_delayed_signals_join_only_where_the_variant_uses_them(runs):
    base, persist, text = runs["base"], runs["persist"], runs["text"]
    assert base["delayed_signals_joined"] == 0 and base["distilled_tokens"] == 0
    assert persist["delayed_signals_joined"] > 0 and persist["distilled_tokens"] == 0
    assert persist["reactions"]["comment"] == 0 and persist["reactions"]["persisted"] > 0
    assert text["reactions"]["comment"] > 0 and text["distilled_tokens"] > 0
    # a comment's context sampled again by the student, distilled too; none without comments
    assert text["student_samples_distilled"] > 0
    assert base["student_samples_distilled"] == persist["student_samples_distilled"] == 0
    for r in (persist, text):  # every judged completion is one sample, once
        assert r["joined"] + r["waiting_at_end"] <= r["reactions"]["accept"] + r["reactions"]["reject"]


def test_the_benchmark_prints_the_keys_it_promises(monkeypatch, test_model, capsys, tmp_path):
    monkeypatch.setattr(learning, "RESULTS", tmp_path)
    small = learning.LearningConfig(requests_per_round=16, window=16, eval_samples=1, eval_tasks=16, min_batch=8)
    args = ["--preset", "test", "--budget", "16", "--distill-coef", "0.5", "--model-seed", "0"]
    out = learning.main(args, base=small)
    assert out["distill_coef"] == 0.5 and out["model_seed"] == 0  # the settings it ran with are in the result
    assert out["epochs"] == 2 and out["distill_step"] is False
    for key in ("requests_to_90_base", "requests_to_90_persist", "requests_to_90_text"):
        assert key in out
    for key in ("final_acceptance_base", "final_acceptance_persist", "final_acceptance_text"):
        assert 0.0 <= out[key] <= 1.0
    assert (tmp_path / "learning.png").stat().st_size > 0
