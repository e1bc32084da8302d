"""The short version of the low-change preset's benchmark: the learning loop serving each version as published
(bf16), the change of every version measured, and benchmarks.guard's two keys written beside the gate's."""

from __future__ import annotations

import json

import pytest

from benchmarks import _change_vs_learning as change, guard

pytestmark = pytest.mark.timeout(600)
BUDGET = 64  # judged requests: two rounds, two versions


def test_a_smaller_step_leaves_more_of_each_version_bit_identical(test_model, tmp_path):
    fast = change.run_setting(2e-4, 2, 1, BUDGET, test_model, tmp_path)
    slow = change.run_setting(1e-5, 1, 1, BUDGET, test_model, tmp_path)
    for r in (fast, slow):
        assert r["versions"] == 2 and [v["version"] for v in r["per_version"]] == [1, 2]
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == BUDGET
    assert slow["optimizer_steps_per_version"] == 1 and fast["optimizer_steps_per_version"] == 2
    assert 0.0 < fast["identical_share_mean"] < slow["identical_share_mean"] < 1.0
    assert slow["delta_ratio_median"] > fast["delta_ratio_median"] > 1.0


def test_guard_writes_the_preset_keys_beside_the_gate_s(monkeypatch, tmp_path):
    monkeypatch.setattr(guard, "RESULTS", tmp_path)
    (tmp_path / "guard.json").write_text(json.dumps({"worse_version_blocked": True}))
    out = guard.run(["--preset-only", "--preset-budget", str(BUDGET)])
    written = json.loads((tmp_path / "guard.json").read_text())
    assert written == out and written["worse_version_blocked"] is True  # the gate's keys as recorded
    assert 0.0 < written["preset_identical_share"] <= 1.0
    assert -1.0 <= written["preset_acceptance_gain"] <= 1.0
    assert written["preset"]["budget"] == BUDGET
