"""The in-place benchmark's figures (benchmarks._delta_inplace.switch_figures): the median of the rounds' side-by-side
ratios (what benchmarks.delta checks against the 0.25 target), the ratio of the medians, every round kept."""

import pytest

from benchmarks._delta_inplace import ROUNDS, switch_figures


def test_the_median_is_of_the_rounds_ratios_and_every_round_is_kept():
    times = {"in_place": [0.5, 0.4, 0.6, 0.45, 0.5], "reload": [2.0, 4.0, 2.0, 1.5, 2.5]}
    f = switch_figures("2pct", times)
    assert f["inplace_vs_reload_runs_2pct"] == [0.25, 0.1, 0.3, 0.3, 0.2]
    assert f["inplace_vs_reload_2pct_median"] == 0.25  # the rounds' ratios: 0.1 0.2 0.25 0.3 0.3
    assert f["inplace_vs_reload_2pct"] == 0.25  # median 0.5 over median 2.0
    assert f["inplace_vs_reload_first_2pct"] == 0.25
    assert f["inplace_switch_s_2pct"] == 0.5 and f["reload_switch_s_2pct"] == 2.0
    assert f["inplace_switch_runs_s_2pct"] == times["in_place"] and f["reload_switch_runs_s_2pct"] == times["reload"]


def test_rounds_are_at_least_five_and_unpaired_rounds_are_refused():
    assert ROUNDS >= 5
    with pytest.raises(ValueError, match="in-place switches"):
        switch_figures("2pct", {"in_place": [0.5, 0.4], "reload": [2.0]})
    with pytest.raises(ValueError, match="in-place switches"):
        switch_figures("2pct", {"in_place": [], "reload": []})
