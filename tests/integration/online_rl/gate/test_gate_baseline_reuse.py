"""A gate judging version after version (`flywheel gate --follow`) reuses a judged version's outcomes as the next
one's baseline: v2 judged against v1 right after v1 was judged runs one suite (the baseline's seconds are 0, and the
same weights differ by nothing); the kept outcomes are the most recent few versions', not every version's."""

from __future__ import annotations

import pytest

from online_rl.gate.run import CACHE_VERSIONS, BaselineCache, GateConfig, remember, run_gate
from online_rl.gate.suite import SuiteConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish

pytestmark = pytest.mark.timeout(600)


def test_a_judged_version_is_the_next_ones_baseline(test_model, tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    pcfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem")
    assert publish(test_model, pcfg).version == 0
    v1 = publish(test_model, pcfg, announce_now=False).version
    v2 = publish(test_model, pcfg, announce_now=False).version
    cfg = GateConfig(publish=pcfg, suite=SuiteConfig(tasks=4, sessions=1, samples=2), work=tmp_path)
    cache: BaselineCache = {}
    first = run_gate(cfg, v1, 0, cache)
    assert first.verdict == "pass" and first.record["figures"]["seconds"]["baseline"] > 0  # v0's suite ran
    second = run_gate(cfg, v2, v1, cache)
    seconds = second.record["figures"]["seconds"]
    assert second.verdict == "pass" and seconds["baseline"] == 0 and seconds["candidate"] > 0  # v1's outcomes reused
    assert second.record["figures"]["pass_at_1"]["diff"] == 0
    assert [k[0] for k in cache] == [0, v1, v2]


def test_the_kept_outcomes_are_the_most_recent_versions():
    cache: BaselineCache = {}
    for v in range(10):
        remember(cache, (v, "suite"), {"v": [v]})
    remember(cache, (7, "suite"), {"v": [7]})  # used again: the most recent
    assert len(cache) == CACHE_VERSIONS and [k[0] for k in cache] == [6, 8, 9, 7]
