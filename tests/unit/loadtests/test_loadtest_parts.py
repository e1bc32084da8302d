"""Pieces of the load tests and the demo report that need no servers: preferences judged by code, the
duration flag, the per-version summary and the demo's verdict."""

import warnings

import pytest

from flywheel.demo import report as demo_report
from flywheel.demo.population import HiddenTests, HouseStyle, Interaction
from loadtests.runner import parse_duration
from online_rl.tasks import synthetic as tasks
from weight_sync.codec import ChunkMeta
from weight_sync.manifest import TensorEntry

TASK = next(t for t in tasks.tasks("heldout") if t.family == "add")


def test_house_style_is_judged_by_parsing_not_by_matching():
    prefers = HouseStyle()
    assert prefers(TASK, f"    return {TASK.arg} + 100\n")  # wrong, but house style: one return
    assert prefers(TASK, f"    return ({TASK.arg}\n            + 1)\n\ndef other():\n    pass\n")
    assert not prefers(TASK, f"    y = {TASK.arg}\n    return y\n")  # two statements
    assert not prefers(TASK, "    return (\n")  # does not parse
    assert not prefers(TASK, "    pass\n")


def test_house_style_keeps_quiet_about_the_models_code():
    """What the parser warns about in a completion ("1if": an invalid decimal literal) is not a warning of ours."""
    with warnings.catch_warnings(record=True) as seen:
        assert HouseStyle()(TASK, f"    return 1if {TASK.arg} else 2\n")
        compile("x = 1if 1 else 2", "<elsewhere>", "exec")  # elsewhere, the same text still warns
    assert [str(w.message) for w in seen] == ["invalid decimal literal"]


def test_hidden_tests_accept_correct_code_only():
    prefers = HiddenTests()
    correct = "    " + TASK.render_body(TASK.spec.body).strip() + "\n"
    assert prefers(TASK, correct)
    assert not prefers(TASK, "    " + TASK.render_body(TASK.spec.wrong[0]).strip() + "\n")


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("2m", 120), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_clear_error():
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration("soon")


def rec(version, outcome, started, latency=0.1):
    return Interaction("u", "t", started, latency, version, outcome)


def test_summary_per_version_and_verdict():
    class M:
        def __init__(self, raw, comp, kind, changed=0):
            self.nbytes_raw, self.nbytes_compressed, self.kind = raw, comp, kind
            # two tensors of 1000 bf16 elements, `changed` of them in the second's second chunk
            chunks = [[ChunkMeta(0, 1000, "planes", 1, "d", 0)], [ChunkMeta(0, 600, "planes", 1, "d", 0)]]
            chunks[1].append(ChunkMeta(600, 400, "sparse", 1, "d", changed))
            self.tensors = [TensorEntry(f"w{i}", "BF16", [1000], c, "d") for i, c in enumerate(chunks)]

    records = (
        [rec(0, "accept", 1.0 + i) for i in range(40)]
        + [rec(0, "reject", 50.0 + i) for i in range(60)]
        + [rec(0, "ignore", 99.0)]
        + [rec(1, "accept", 200.0 + i, 0.2) for i in range(70)]
        + [rec(1, "reject", 300.0 + i) for i in range(30)]
        + [rec(None, "failed", 250.0), rec(None, "failed", 0.5)]  # the second before any answer
        + [
            Interaction("a", "t", 260.0 + i, 2.0, 1, o, kind="agent", turns=4)
            for i, o in enumerate(("accept", "accept", "reject"))
        ]
    )
    switches = [
        {"version": 1, "pause_ms": 0.0, "drain_ms": 120.0, "load_ms": 300.0},
        {"version": 1, "pause_ms": 15.0, "load_ms": 280.0},
    ]
    rows = demo_report.summarize(
        records, switches, {0: M(4_000_000, 3_000_000, "full", 2000), 1: M(4_000_000, 100_000, "delta", 30)}
    )
    v0, v1 = rows
    assert (v0["version"], v0["acceptance"], v0["judged"], v0["requests"], v0["failed"]) == (0, 0.4, 100, 101, 1)
    assert (v1["acceptance"], v1["failed"], v1["switch_pause_ms"], v1["out_of_rotation_ms"]) == (0.7, 1, 15.0, 420.0)
    assert (v1["agent_acceptance"], v1["sessions"], v0["agent_acceptance"], v0["sessions"]) == (0.6667, 3, None, 0)
    assert v1["p99_ms"] < 1000  # the agent sessions' durations (2 s) are not request latencies
    assert v1["delta_ratio"] == 40.0 and v0["switch_pause_ms"] is None
    assert set(demo_report.FIELDS) <= set(v0)
    # bit-identical to the base: 1970 of 2000 elements; a full snapshot has no base to compare with
    assert v1["identical_share"] == 0.985 and v0["identical_share"] is None
    assert " 98.5%" in demo_report.table(rows).splitlines()[-1]
    v = demo_report.verdict(rows)
    assert v["rise_points"] == 30.0 and v["failed_requests"] == 2 and not v["goal_met"]  # a failure spoils it
    assert "v1" in demo_report.table(rows)


def test_users_react_with_the_same_draws_whatever_they_send():
    import random

    from flywheel.demo.population import PopulationConfig, react

    task = tasks.tasks("heldout")[3]
    wrong = task.wrong_bodies()[1]
    seen = {}
    for mode in ("basic", "persist", "text"):
        cfg = PopulationConfig(feedback=mode, fooled_rate=0.3, comment_rate=0.5)
        rng = random.Random(7)
        seen[mode] = [react(rng, cfg, task, wrong if i % 2 else task.reference, i % 2 == 0, 0.1) for i in range(200)]
    outcomes = {m: [r.outcome for r in rs] for m, rs in seen.items()}
    assert outcomes["basic"] == outcomes["persist"] == outcomes["text"]  # the same users, whatever they send
    assert all(r.comment is None and r.still_present is None for r in seen["basic"])
    persist, text = seen["persist"], seen["text"]
    # an accepted function is checked later: kept when it passes, deleted when it fails (a fooled accept)
    assert {(i % 2 == 0, r.still_present) for i, r in enumerate(persist) if r.outcome == "accept"} == {
        (True, True),
        (False, False),
    }
    assert all(r.still_present is None for r in persist if r.outcome != "accept")
    assert all(r.comment is None for r in persist)
    # comments only on failing code, in the hint language the corpus teaches
    comments = [r.comment for i, r in enumerate(text) if r.comment is not None]
    assert comments and all(i % 2 for i, r in enumerate(text) if r.comment is not None)
    assert set(comments) == {tasks.hint_for(task, wrong)} and tasks.hint_for(task, wrong).startswith("use ")
    fooled = [r for i, r in enumerate(text) if i % 2 and r.outcome == "accept"]
    assert fooled and 0.15 < len(fooled) / 90 < 0.45  # about fooled_rate of the failing ones (ignores aside)


def test_kept_share_and_requests_to_90_in_the_demo_summary():
    def judged(version, n, kept, fooled, start):
        out = []
        for i in range(n):
            passed = i < kept
            outcome = "accept" if passed or i < kept + fooled else "reject"
            out.append(Interaction("u", "t", start + i, 0.1, version, outcome, passed=passed))
        return out

    records = judged(0, 40, 20, 8, 0.0) + judged(1, 40, 30, 4, 100.0) + judged(2, 40, 37, 2, 200.0)
    rows = demo_report.summarize(records, [], {})
    assert [r["kept"] for r in rows] == [0.5, 0.75, 0.925]
    assert [r["acceptance"] for r in rows] == [0.7, 0.85, 0.975]
    assert demo_report.verdict(rows)["requests_to_90"] == 80  # judged requests of v0 and v1
    assert "92.5" in demo_report.table(rows)
