"""Agent sessions on mined tasks, on scripted answers: the workspace is the repository's file with the body deleted,
at its own path; the ask names the function; run_tests and the outcome go to the mined tasks' judge with the files as
the agent left them. The draw: no mined share is today's draw exactly; a share draws mined tasks too. (The same
session against the real sandbox judge: tests/integration/flywheel/demo/test_agent_session_mined.py.)"""

from __future__ import annotations

import json
import random

import pytest

from flywheel.demo.agent_session import PATHS, Repository, agent_mixture, run_session, workspace
from flywheel.demo.population import PopulationConfig
from online_rl.tasks import synthetic
from online_rl.tasks.mining import candidates, store
from tests.scripted_agent import answer, scripted

CODE = 'def area(w, h):\n    """The area."""\n    if w < 0:\n        raise ValueError\n    a = w * h\n    return a\n'


def mined_task(root) -> store.MinedTask:
    (d,), _ = candidates.find(CODE, "geo/shapes.py")
    return store.MinedTask(
        task_id="x/geo/shapes.py::area", source="x", version="1", origin="local", root=str(root),
        path="geo/shapes.py", qualname="area", lineno=d.lineno, prefix=d.prefix, suffix=d.suffix, reference=d.body,
        indent=d.indent, test_path="tests/test_shapes.py", test_module="test_shapes",
        test_ids=("test_shapes.T.test_area", "test_shapes.T.test_negative"), paths=("", "tests"), fresh=("geo.shapes",),
        ship_all=True, code_sha256=store.sha256(d.original), sandbox_s=1.0,
    )  # fmt: skip


def judge(task, code):  # two tests: both pass only on the original file
    assert isinstance(code, dict) and set(code) == {"geo/shapes.py"}
    return (2, 2) if code["geo/shapes.py"] == CODE else (0, 2)


def test_a_session_on_a_mined_task_restores_the_body(tmp_path):
    task = mined_task(tmp_path)
    deleted = workspace(task, "ignored.py")["geo/shapes.py"]
    assert "a = w * h" not in deleted and deleted.endswith('"""The area."""\n    raise NotImplementedError\n')
    chat, seen = scripted(
        [
            answer(0, [("read_file", {"path": "geo/shapes.py"})]),
            answer(
                1,
                [
                    (
                        "write_file",
                        {
                            "path": "geo/shapes.py",
                            "content": deleted.replace("    raise Not", "    x = 0\n    raise Not"),
                        },
                    )
                ],
            ),
            answer(2, [("run_tests", {"path": "geo/shapes.py"})]),
            answer(3, [("write_file", {"path": "geo/shapes.py", "content": CODE})]),
            answer(4, [("run_tests", {"path": "geo/shapes.py"})]),
            answer(5, text="Done."),
        ]
    )
    res = run_session(chat, task, random.Random(0), judge, max_turns=6)
    assert seen[0][0]["content"].startswith("Implement `area` in geo/shapes.py")
    assert [m["content"] for m in seen[-1] if m["role"] == "tool"] == [
        deleted,
        "ok",
        "2 failed, 0 passed",
        "ok",
        "2 passed",
    ]
    assert (res.outcome, res.turns, res.writes) == ("accept", 6, ["cmpl-1", "cmpl-3"])
    assert res.truth["cmpl-1"] is False and res.truth["cmpl-3"] is True


def test_a_mined_session_that_leaves_the_file_as_it_was_is_rejected(tmp_path):
    task = mined_task(tmp_path)
    repo = Repository(task, "app.py", judge)
    assert not repo.kept() and repo.call("run_tests", '{"path": "geo/shapes.py"}') == "2 failed, 0 passed"
    assert repo.call("write_file", json.dumps({"path": "geo/shapes.py", "content": CODE})) == "ok" and repo.kept()
    chat, _ = scripted([answer(0, text="I cannot.")])
    assert run_session(chat, task, random.Random(0), judge).outcome == "reject"


def Cfg(share: float = 0.0, where: str | None = None) -> PopulationConfig:
    return PopulationConfig(agents=1, mined_share=share, mined_tasks=where, mined_rewards_forgeable_ok=share > 0)


def test_the_draw_is_unchanged_without_a_mined_share_and_mixes_with_one(tmp_path):
    held = synthetic.tasks("heldout")
    assert agent_mixture(Cfg(), held, 0) is None  # the population draws rng.choice(tasks), as it always did
    store.save([mined_task(tmp_path)], tmp_path / "m" / "tasks.jsonl")
    mix = agent_mixture(Cfg(0.5, str(tmp_path)), held, 0)
    drawn = [mix.draw(1)[0] for _ in range(200)]
    assert 60 < sum(isinstance(t, store.MinedTask) for t in drawn) < 140
    assert (
        agent_mixture(Cfg(0.5, str(tmp_path)), held, 1).rng.random()
        != agent_mixture(Cfg(0.5, str(tmp_path)), held, 0).rng.random()
    )
    with pytest.raises(FileNotFoundError):
        agent_mixture(Cfg(0.5, str(tmp_path / "none")), held, 0)
    # A synthetic task's session is the one it always was: its file one of PATHS, holding the task's prompt.
    assert workspace(held[0], PATHS[0]) == {PATHS[0]: held[0].prompt}


def test_a_mined_share_is_asked_for_by_name():
    """Agent sessions on mined tasks train on rewards an agent can forge: opted into as the rollouts' mined share is."""
    from flywheel.demo.run import DemoConfig

    with pytest.raises(ValueError, match="--mined-rewards-forgeable-ok"):
        PopulationConfig(agents=1, mined_share=0.3)
    with pytest.raises(ValueError, match="--mined-rewards-forgeable-ok"):
        DemoConfig(agent_mined_share=0.3)
    with pytest.raises(ValueError, match="within"):
        PopulationConfig(agents=1, mined_share=1.5, mined_rewards_forgeable_ok=True)
    assert PopulationConfig(agents=1, mined_share=0.3, mined_rewards_forgeable_ok=True).mined_share == 0.3
    assert DemoConfig(agent_mined_share=0.3, mined_rewards_forgeable_ok=True).agent_mined_share == 0.3
    assert PopulationConfig(agents=1).mined_share == DemoConfig().agent_mined_share == 0.0  # no share: nothing to ask


def test_a_missing_mined_tasks_path_is_an_error_before_any_agent_runs(tmp_path):
    from flywheel.demo.population import Population

    cfg = PopulationConfig(
        agents=2, mined_share=0.5, mined_tasks=str(tmp_path / "typo"), mined_rewards_forgeable_ok=True
    )
    with pytest.raises(FileNotFoundError, match="typo"):
        Population(cfg, "http://127.0.0.1:9", ["key"])
    store.save([mined_task(tmp_path)], tmp_path / "m" / "tasks.jsonl")
    pop = Population(PopulationConfig(**{**cfg.__dict__, "mined_tasks": str(tmp_path)}), "http://127.0.0.1:9", ["k"])
    assert len(pop._mixtures) == 2 and all(m is not None and m.mined for m in pop._mixtures)


def test_agents_draw_body_and_feature_folders_by_default(tmp_path, monkeypatch):
    """`flywheel tasks mine` writes body tasks to $FLYWHEEL_HOME/tasks/mined, feature tasks to tasks/mined-feature:
    the agents' default draws both."""
    import dataclasses

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    body = mined_task(tmp_path)
    other = dataclasses.replace(body, task_id="y/geo/shapes.py::area", source="y")
    store.save([body], tmp_path / "home" / "tasks" / "mined" / "x" / "tasks.jsonl")
    store.save([other], tmp_path / "home" / "tasks" / "mined-feature" / "y-feature" / "tasks.jsonl")
    mix = agent_mixture(PopulationConfig(agents=1, mined_share=1.0, mined_rewards_forgeable_ok=True), [], 0)
    assert sorted(t.task_id for t in mix.mined) == sorted([body.task_id, other.task_id])
