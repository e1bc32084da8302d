"""Multi-line task families: each wrong body is one line off, fails its tests, and a hint names that line."""

import pytest

from online_rl.sandbox import judge as sandbox
from online_rl.tasks import corpus as TC, multiline, synthetic as T


def _outputs(task: T.Task, body: str) -> list:
    ns: dict = {}
    exec(task.prompt + body, ns)  # noqa: S102 - our own task definitions
    return [repr(T._call(ns[task.name], x)) for x in task.test_inputs()]


def test_every_wrong_body_is_one_line_off_and_fails_in_process():
    tasks_ = T.tasks("train", families="multiline") + T.tasks("heldout", families="multiline")
    assert {t.family for t in tasks_} == {f.key for f in multiline.MULTILINE_FAMILIES}
    for t in tasks_:
        ref = t.reference.split("\n")
        assert len([line for line in ref if line.strip()]) >= 3, t.task_id
        expected = [repr(y) for y in t.expected_outputs()]
        for w in t.wrong_bodies():
            wrong = w.split("\n")
            assert len(wrong) == len(ref) and sum(a != b for a, b in zip(ref, wrong)) == 1, (t.task_id, w)
            assert _outputs(t, w) != expected, (t.task_id, w)


def test_reference_passes_and_wrong_bodies_fail_in_the_sandbox():
    ts = list({t.family: t for t in T.tasks("heldout", families="multiline")}.values())
    assert len(ts) == len(multiline.MULTILINE_FAMILIES)
    verdicts = sandbox.run(
        [sandbox.candidate_for(t, t.reference) for t in ts]
        + [sandbox.candidate_for(t, w) for t in ts for w in t.wrong_bodies()]
    )
    assert all(v.ok for v in verdicts[: len(ts)]) and not any(v.ok for v in verdicts[len(ts) :])


def test_a_hint_names_the_first_wrong_line_in_the_one_line_hint_language():
    t = T.Task("sum_above", 3, "xs")  # total = 0 / for v in xs: / if v > 3: / total += v / return total
    assert T.hint_for(t, t.render_body(t.spec.wrong[0])) == "use if v > 3:"  # `if v >= 3:`
    assert T.hint_for(t, t.render_body(t.spec.wrong[1])) == "use total += v"  # `total += 1`
    assert T.hint_for(t, t.render_body(t.spec.wrong[3])) == "use 3, not 4"  # `if v > 4:`: the constant only
    sum_to = T.Task("sum_to", 2, "n")
    assert T.hint_for(sum_to, sum_to.render_body(sum_to.spec.wrong[2])) == "use total * 2"  # a return: no `return`
    assert T.hint_for(t, "    pass\n") == "use total = 0"  # nothing right: the first line
    assert T.hint_for(t, t.reference + "    print(1)\n") == "use total"  # every line right: the last
    spaced = t.reference.replace("    for v", "\n    for v")  # a blank line moves no line
    assert T.hint_for(t, spaced.replace("total += v", "total += 1")) == "use total += v"
    # One-line families keep their hints as they were
    assert T.hint_for(T.Task("tail", 3, "xs"), "    return xs[-4:]\n") == "use 3, not 4"


def test_family_sets_and_their_errors():
    single, multi = T.tasks("heldout"), T.tasks("heldout", families="multiline")
    both = T.tasks("heldout", families="all")
    assert {t.task_id for t in both} == {t.task_id for t in single} | {t.task_id for t in multi}
    assert not {t.family for t in single} & {t.family for t in multi}
    # A family's split is the same whatever set it is drawn with: a multi-line task held out is held out in "all"
    assert {t.task_id for t in T.tasks("train", families="all")}.isdisjoint({t.task_id for t in both})
    with pytest.raises(ValueError, match="unknown family set"):
        T.tasks("heldout", families="double")


def test_the_corpus_draws_multiline_documents_only_when_asked():
    plain = TC.CorpusConfig(seed=0, documents=1500)
    assert TC.corpus(plain) == TC.corpus(TC.CorpusConfig(seed=0, documents=1500, multiline_share=0.0))
    docs = TC.corpus(TC.CorpusConfig(seed=0, documents=1500, multiline_share=0.5, agent_share=0.0))
    names = {f"def {t.name}(" for t in T.tasks("train", families="multiline")}
    multi = [d for d in docs if any(n in d for n in names)]
    assert 0.35 < len(multi) / len(docs) < 0.65
    held = {f"def {t.name}({t.arg})" for t in T.tasks("heldout", families="multiline")}
    assert not any(h in d for d in docs for h in held)
    by_signature = {f"def {t.name}({t.arg}):": t for t in T.tasks("train", families="multiline")}
    hinted = [d for d in multi if T.HINT_PREFIX in d and not d.startswith(T.FIM_PREFIX)]
    assert hinted
    for d in hinted:  # a hint the population would give about a wrong body, then the right body
        head, rest = d.removesuffix(T.EOS).split(T.HINT_PREFIX)
        hint, body = rest.split("\n", 1)
        t = by_signature[head.split("\n", 1)[0]]
        assert body == t.reference and hint in {T.hint_for(t, w) for w in t.wrong_bodies()}
