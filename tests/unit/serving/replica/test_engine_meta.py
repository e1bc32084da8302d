"""What the gateway reads from a replica's meta_info: the version is the one that made the tokens."""

from serving.replica import engine


def fill(meta: dict) -> engine.EngineResult:
    res = engine.EngineResult()
    engine._fill(res, {"output_ids": [5, 6, 7], "text": "abc", "meta_info": meta}, layers=2, top_k=2)
    return res


def test_version_is_the_first_spans_not_the_replicas_current_one():
    # During a rollback v3 -> v1 SGLang's tokenizer still says "3" while the scheduler already made the
    # tokens with v1: every chunk must name v1, as the logged event does.
    res = fill({"weight_version": "3", "weight_versions": [{"version": "1", "start": 0, "end": 3}]})
    assert res.weight_version == 1
    assert res.weight_versions == [{"version": 1, "start": 0, "end": 3}]


def test_a_switch_mid_answer_keeps_the_version_of_the_first_token():
    spans = [{"version": "2", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 3}]
    res = fill({"weight_version": "3", "weight_versions": spans})
    assert res.weight_version == 2 and [s["version"] for s in res.weight_versions] == [2, 3]


def test_without_spans_the_replicas_version_is_used():
    assert fill({"weight_version": "4"}).weight_version == 4
    assert fill({}).weight_version is None


def test_the_fleet_view_takes_the_version_of_the_last_token():
    spans = [{"version": "2", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 3}]
    assert fill({"weight_version": "2", "weight_versions": spans}).latest_version == 3
    assert fill({"weight_version": "4"}).latest_version == 4
