"""Tasks are judged by running code, and the sandbox holds candidates to their limits."""

import functools
import json

import pytest

from online_rl.sandbox import judge as sandbox
from online_rl.tasks import corpus as TC, synthetic as tasks


def test_splits_are_disjoint_and_stable():
    train = {t.task_id for t in tasks.tasks("train")}
    held = {t.task_id for t in tasks.tasks("heldout")}
    assert train and held and not (train & held)
    assert len(held) / (len(train) + len(held)) == pytest.approx(0.2, abs=0.05)
    assert held == {t.task_id for t in tasks.tasks("heldout")}
    assert held != {t.task_id for t in tasks.tasks("heldout", seed=1)}


def test_corpus_is_deterministic_and_never_contains_heldout_functions():
    cfg = TC.CorpusConfig(seed=3, documents=2000)
    docs = TC.corpus(cfg)
    assert docs == TC.corpus(cfg)
    held_names = {(t.name, t.arg) for t in tasks.tasks("heldout", seed=3)}
    for d in docs:
        assert d.endswith(tasks.EOS)
        for name, arg in held_names:
            assert f"def {name}({arg})" not in d


def test_hints_say_why_a_body_failed_and_the_corpus_follows_them_with_the_right_body():
    t = tasks.Task("tail", 3, "xs")  # reference: return xs[-3:]
    assert tasks.hint_for(t, "    return xs[-4:]\n") == "use 3, not 4"  # the right expression, a wrong constant
    assert tasks.hint_for(t, "    return xs[:3]\n") == "use xs[-3:]"  # anything else: what to return
    assert tasks.hint_for(t, "    pass\n") == "use xs[-3:]" == tasks.hint_for(t, t.reference)
    assert tasks.hint_line("use 3, not 4") == "    # hint: use 3, not 4\n"
    docs = TC.corpus(TC.CorpusConfig(seed=0, documents=3000))
    hinted = [d for d in docs if tasks.HINT_PREFIX in d]
    assert 0.05 < len(hinted) / len(docs) < 0.15  # hint_share 0.1
    by_signature = {f"def {t.name}({t.arg}):": t for t in tasks.tasks("train")}
    for d in hinted[:200]:
        head, body = d.removesuffix(tasks.EOS).split(tasks.HINT_PREFIX)
        hint, body = body.split("\n", 1)
        t = by_signature[head.split("\n", 1)[0]]
        assert body == t.reference and hint in {tasks.hint_for(t, w) for w in t.wrong_bodies()}


def _outputs(task: tasks.Task, body: str) -> list:
    ns: dict = {}
    exec(task.prompt + body, ns)  # noqa: S102 - our own task definitions
    return [repr(tasks._call(ns[task.name], x)) for x in task.test_inputs()]


def test_every_wrong_body_of_every_task_fails_in_process():
    """The generator's promise, over every task of both splits, run here (our own code: no jail needed). The
    reference is what the expected outputs are computed from: the jailed test below checks it passes."""
    for t in tasks.tasks("heldout") + tasks.tasks("train"):
        expected = [repr(y) for y in t.expected_outputs()]
        for w in t.wrong_bodies():
            assert _outputs(t, w) != expected, (t.task_id, w)


def test_reference_passes_and_every_wrong_body_fails_in_the_sandbox():
    """The same through the jail, one task of each family (all 704 candidates took 61-94 s of the suite)."""
    ts = list({t.family: t for t in tasks.tasks("heldout")}.values())
    assert len(ts) == len(tasks.FAMILIES)
    cands = [sandbox.candidate_for(t, t.reference) for t in ts]
    wrong = [sandbox.candidate_for(t, w) for t in ts for w in t.wrong_bodies()]
    verdicts = sandbox.run(cands + wrong)
    assert all(v.ok for v in verdicts[: len(cands)])
    assert not any(v.ok for v in verdicts[len(cands) :])


def test_equivalent_code_passes_regardless_of_text():
    t = tasks.Task("add", 3, "x")
    body = "    y = 3\n    return y + x\n"
    assert body != t.reference
    assert sandbox.run([sandbox.candidate_for(t, body)])[0].ok


@pytest.mark.timeout(60)
def test_limits_are_counted_by_kind():
    t = tasks.Task("add", 3, "x")
    bodies = {
        "loop": "    while True:\n        pass\n",
        "memory": "    return len(bytearray(10 ** 10))\n",
        "syntax": "  return (\n",
        "peek": "    import gc\n"
        "    return [o for o in gc.get_objects() if isinstance(o, dict) and 'expected' in o][0]\n",
    }
    v = dict(
        zip(
            bodies,
            sandbox.run(
                [sandbox.candidate_for(t, b) for b in bodies.values()],
                sandbox.SandboxConfig(cpu_seconds=1, wall_seconds=3),
            ),
        )
    )
    assert v["loop"].error in ("cpu time limit", "wall time limit")
    assert v["memory"].passed == 0 and "memory" in v["memory"].contained
    assert v["syntax"].error.startswith("does not load") and v["syntax"].contained == ()
    assert v["peek"].passed == 0 and "introspection" in v["peek"].contained  # expected outputs never enter


def _reply(*messages) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def test_result_channel_is_judged_like_an_honest_evaluator():
    """What comes back is parsed, never trusted: literals only, exactly one result, raises by name."""
    c = sandbox.Candidate("", "f", [1, 2, 3], [repr(4), repr([5]), repr("<raises ValueError>")])
    judge = functools.partial(sandbox._verdict, c, sandbox.SandboxConfig())
    ok = {"result": {"outputs": [{"repr": "4"}, {"repr": "[5]"}, {"raises": "ValueError"}]}}
    assert judge(_reply(ok), 0, None).passed == 3
    assert judge(_reply({"attempt": "network"}, ok), 0, None).contained == ("network",)
    fake = {"result": {"outputs": [{"repr": "__import__('os')"}, {"repr": "[5]"}, {"repr": "1"}]}}
    assert judge(_reply(fake), 0, None).passed == 1  # not a literal: never equal
    assert judge(_reply(ok, ok), 0, None).error == "more than one result"
    assert judge(_reply({"result": {"passed": 3}}), 0, None).error == "malformed result"
    assert judge(b"garbage\n" + _reply(ok), 0, None).contained == ("bad_output",)
    assert judge(b"", 0, None).contained == ("early_exit",)
    assert judge(b"", 128 + 24, None).error == "cpu time limit"
    assert judge(b"", 128 + 11, None).contained == ("crash",)
    assert judge(_reply({"attempt": "signal"}), 128 + 9, None).contained == ("crash", "signal")
    assert judge(_reply(ok), 0, "wall_time").reward == 0


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError):
        tasks.tasks("validation")
