"""The short version of the low-change preset's benchmark: the learning loop serving each version as published
(bf16), the change of every version measured, and benchmarks.guard's two keys written beside the gate's."""

from __future__ import annotations

import json

import pytest

from benchmarks import _change_vs_learning as change, guard

pytestmark = pytest.mark.timeout(900)
BUDGET = 64  # judged requests of the fast setting: two versions of 32
PRESET_BUDGET = 32  # the preset's: four versions of 8


@pytest.fixture(scope="module")
def runs(test_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("change")
    lr, epochs, k, n = change.PRESET_SETTING
    small = {"eval_tasks": 16}  # the curve's ends only are checked here: a rougher evaluation than the sweep's 96
    return {
        "fast": change.run_setting(2e-4, 2, 1, BUDGET, test_model, work, **small),
        "preset": change.run_setting(lr, epochs, k, PRESET_BUDGET, test_model, work, requests_per_round=n, **small),
    }


def test_a_smaller_step_leaves_more_of_each_version_bit_identical(runs):
    fast, preset = runs["fast"], runs["preset"]
    assert fast["versions"] == 2 and [v["version"] for v in fast["per_version"]] == [1, 2]
    assert preset["versions"] >= 3  # a version an update of 8 (ignored requests are not judged)
    for r, budget in ((fast, BUDGET), (preset, PRESET_BUDGET)):
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == budget
    assert preset["optimizer_steps_per_version"] == 1 and fast["optimizer_steps_per_version"] == 2
    assert 0.0 < fast["identical_share_mean"] < preset["identical_share_mean"] < 1.0
    assert preset["delta_ratio_median"] > fast["delta_ratio_median"] > 1.0


def test_guard_takes_the_preset_keys_from_the_sweep_s_run(monkeypatch, tmp_path, runs):
    monkeypatch.setattr(guard, "RESULTS", tmp_path)
    (tmp_path / "guard.json").write_text(json.dumps({"worse_version_blocked": True}))
    (tmp_path / "records").mkdir()
    record = {"budget_judged_requests": BUDGET, "runs": list(runs.values())}
    (tmp_path / change.RECORD).write_text(json.dumps(record))
    out = guard.run(["--preset-from-record"])
    assert json.loads((tmp_path / "guard.json").read_text()) == out and out["worse_version_blocked"] is True
    assert out["preset_identical_share"] == runs["preset"]["identical_share_mean"]
    assert out["preset_acceptance_gain"] == runs["preset"]["acceptance_gain"]


def test_guard_runs_the_preset_and_writes_its_keys_beside_the_gate_s(monkeypatch, tmp_path):
    monkeypatch.setattr(guard, "RESULTS", tmp_path)
    (tmp_path / "guard.json").write_text(json.dumps({"worse_version_blocked": True}))
    out = guard.run(["--preset-only", "--preset-budget", "16"])
    written = json.loads((tmp_path / "guard.json").read_text())
    assert written == out and written["worse_version_blocked"] is True  # the gate's keys as recorded
    assert 0.0 < written["preset_identical_share"] <= 1.0
    assert -1.0 <= written["preset_acceptance_gain"] <= 1.0
    assert written["preset"]["budget"] == 16 and written["preset"]["lr"] == change.LOW_CHANGE.lr
