"""The low-change preset's switch, short (benchmarks._preset_switch): two versions of the preset's setting from the
learning loop on the test model, published as signed deltas, and the session's second replica switched to each by
the agent, in place and by a reload side by side."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import _change_vs_learning as change, _preset_switch as switch
from benchmarks._store_server import serve_store
from infra.procs import stop_pid
from weight_sync.manifest import generate_key

pytestmark = pytest.mark.timeout(900)


def test_a_preset_version_is_a_sparse_delta_switched_in_place_that_answers_as_a_reload(
    test_model, second_replica, tmp_path
):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    v = switch.make_versions(
        change.PRESET_SETTING, 2, test_model, tmp_path / "run", tmp_path / "k.pem", "test", eval_tasks=8
    )
    proc, url = serve_store(v.store)
    try:
        switched = switch.switch_versions(v, second_replica.url, url, tmp_path / "k.pub", tmp_path / "agents")
    finally:
        stop_pid(proc.pid)
        asyncio.run(switch.put_back(second_replica.url, test_model, 0))  # the session's replica as it was
    out = switch.setting_figures("preset", v, switched)
    assert [r["version"] for r in switched["rows"]] == [1, 2]
    # every switch timed_switch made went the way asked (in place / reload), and gave a reload's answer
    assert len(out["preset_switch_runs_s"]) == len(out["preset_reload_runs_s"]) == 2
    assert out["preset_switch_same_answers"] is True
    # sparse: each version a delta against the one before, most bf16 weights bit-identical, sent as changed elements
    assert out["preset_switch_delta_kinds"] == ["delta"] and [r.base_version for r in v.published] == [0, 1]
    assert min(out["preset_switch_identical_shares"]) > 0.9 and out["preset_switch_delta_ratio_median"] > 5
    # what changed travels as positions and values; a tensor with over 5% of it changed travels whole
    for r in switched["rows"]:
        assert r["patch_sparse_elems"] > 0 and (r["patch_full_elems"] > 0) == (r["tensors_whole"] > 0), r
