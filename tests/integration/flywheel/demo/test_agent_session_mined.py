"""Agent sessions on mined tasks against the real sandbox judge: a small repository made here is mined (a body task
and a feature task, each verified in the bubblewrap sandbox by `flywheel tasks mine`), then scripted sessions read
the file, write it, and run the repository's own kept tests through the mined tasks' judge (the default judge of
run_session): a wrong body fails them and the session is rejected; the restored body (or the restored feature, in
both files) passes them and the session is accepted."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil

import pytest

from flywheel.demo import report
from flywheel.demo.agent_session import run_session, workspace
from online_rl.tasks.mining import cli, store
from tests import mined_repo, scripted_agent
from tests.scripted_agent import scripted

pytestmark = pytest.mark.timeout(180)

PRICING = mined_repo.PRICING

CART = '"""The cart."""\nfrom shop.pricing import discount\n\n\n' + mined_repo.RECEIPT

TESTS = """\
import unittest

from shop.cart import receipt
from shop.pricing import checkout, discount


class ShopTest(unittest.TestCase):
    def test_discount(self):
        self.assertEqual(discount(10, 10), 9.0)

    def test_checkout(self):
        self.assertEqual(checkout([10, 20], 50), 15.0)

    def test_receipt(self):
        self.assertEqual(receipt(40, 25), "total 30.00")
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    shop = {"shop/__init__.py": "", "shop/pricing.py": PRICING, "shop/cart.py": CART, "tests/test_shop.py": TESTS}
    repo = mined_repo.write_repo(tmp_path_factory.mktemp("shop"), shop)
    out = repo.parent / "out"
    found = {}
    for mode in ("body", "feature"):
        assert cli.main(["tasks", "mine", str(repo), "--mode", mode, "--out", str(out), "--no-progress"]) == 0
        folder = out / (repo.name + ("-feature" if mode == "feature" else ""))
        found[mode] = {t.qualname: t for t in store.load([folder / "tasks.jsonl"])}
    return found


def answer(i, calls=None, text=None):  # the session id the feedback check below expects
    return scripted_agent.answer(i, calls, text, session_id="s", model_version=1)


def test_a_session_on_a_mined_body_is_judged_by_the_repositorys_tests(tasks):
    task = tasks["body"]["discount"]
    path = task.path
    deleted = workspace(task, "")[path]
    wrong = task.prefix + task.indent + "return price\n" + task.suffix
    right = task.prefix + task.reference + task.suffix
    chat, seen = scripted(
        [
            answer(0, [("read_file", {"path": path})]),
            answer(1, [("write_file", {"path": path, "content": wrong})]),
            answer(2, [("run_tests", {"path": path})]),
            answer(3, [("write_file", {"path": path, "content": right})]),
            answer(4, [("run_tests", {"path": path})]),
            answer(5, text="Done: the tests pass."),
        ]
    )
    res = run_session(chat, task, random.Random(0), max_turns=6)  # the default judge: the sandbox's, mined tasks'
    results = [m["content"] for m in seen[-1] if m["role"] == "tool"]
    n = len(task.test_ids)
    assert results == [deleted, "ok", f"{n} failed, 0 passed", "ok", f"{n} passed"]
    assert res.outcome == "accept" and res.truth["cmpl-1"] is False and res.truth["cmpl-3"] is True
    chat, _ = scripted([answer(0, [("write_file", {"path": path, "content": wrong})]), answer(1, text="Done.")])
    assert run_session(chat, task, random.Random(0)).outcome == "reject"


def test_a_session_on_a_mined_feature_restores_both_files(tasks):
    task = tasks["feature"]["discount"]
    assert set(task.shown) == {"shop/pricing.py", "shop/cart.py"}
    chat, seen = scripted(
        [
            answer(0, [("read_file", {"path": "shop/cart.py"})]),
            answer(1, [("write_file", {"path": "shop/pricing.py", "content": task.reference["shop/pricing.py"]})]),
            answer(2, [("run_tests", {"path": "shop/pricing.py"})]),
            answer(3, [("write_file", {"path": "shop/cart.py", "content": task.reference["shop/cart.py"]})]),
            answer(4, [("run_tests", {"path": "shop/cart.py"})]),
            answer(5, text="Restored."),
        ]
    )
    res = run_session(chat, task, random.Random(0), max_turns=6)
    results = [m["content"] for m in seen[-1] if m["role"] == "tool"]
    n = len(task.test_ids)
    assert seen[0][0]["content"].startswith("The function `discount` was deleted from shop/pricing.py")
    assert results[0] == task.shown["shop/cart.py"] and results[2] != f"{n} passed" and results[4] == f"{n} passed"
    assert res.outcome == "accept" and res.truth["cmpl-1"] is False and res.truth["cmpl-3"] is True


def test_the_populations_agent_draws_mined_tasks_and_is_judged_by_their_tests(tasks, tmp_path):
    """The agent user's whole loop (PopulationConfig.mined_share=1) against a stand-in gateway that restores the
    body: the draw, the workspace, the sandbox judge and the session's feedback, as the demo runs them."""
    import re
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from flywheel.demo.population import Population, PopulationConfig

    task = tasks["body"]["discount"]
    store.save([task], tmp_path / "mined" / "tasks.jsonl")
    feedback = []

    class Gateway(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/feedback":
                feedback.append(body)
                out = {"ok": True}
            else:
                msgs = body["messages"]
                path = re.search(r"in (\S+\.py)", msgs[0]["content"]).group(1)
                step = sum(m["role"] == "tool" for m in msgs)
                right = task.prefix + task.reference + task.suffix
                calls = [
                    [("read_file", {"path": path})],
                    [("write_file", {"path": path, "content": right})],
                    [("run_tests", {"path": path})],
                ]
                out = answer(step, calls[step] if step < 3 else None, None if step < 3 else "Done.")
                out.update(object="chat.completion", created=0, model="flywheel-coder")
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def first_record(where):
        cfg = PopulationConfig(
            users=0,
            agents=1,
            agent_api="chat",
            mined_share=1.0,
            mined_tasks=str(where),
            think_s=(0, 0),
            mined_rewards_forgeable_ok=True,
        )
        pop = Population(cfg, f"http://127.0.0.1:{server.server_address[1]}", ["key"]).start()
        try:
            deadline = time.monotonic() + 90
            while not pop.snapshot() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            pop.stop()
        return pop.snapshot()[0]

    # The repository changed since mining: its judge refuses the task, which is no failed request (serving answered).
    stale = tmp_path / "stale-root"
    shutil.copytree(task.root, stale)
    (stale / task.path).write_text((stale / task.path).read_text() + "\n# edited\n")
    store.save([dataclasses.replace(task, root=str(stale))], tmp_path / "stale" / "tasks.jsonl")
    try:
        rec = first_record(tmp_path / "mined")
        refused = first_record(tmp_path / "stale")
    finally:
        server.shutdown()
        server.server_close()
    assert (rec.kind, rec.task_id, rec.outcome, rec.error) == ("agent", task.task_id, "accept", None)
    assert (
        rec.turns == 4
        and rec.tool_calls == 3
        and rec.truth == {"cmpl-0": True, "cmpl-1": True, "cmpl-2": True, "cmpl-3": True}
    )
    assert {"session_id": "s", "kind": "accept"} in feedback
    assert refused.outcome == "judge_error" and "changed since it was mined" in refused.error, refused
    rows = report.summarize([rec, refused], [{"version": 1}], {})
    assert rows[0]["failed"] == 0 and report.verdict(rows, min_judged=0)["failed_requests"] == 0
    failed = dataclasses.replace(refused, outcome="failed")
    assert report.summarize([rec, failed], [{"version": 1}], {})[0]["failed"] == 1
