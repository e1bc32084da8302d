"""Feature mode through the real bubblewrap sandbox: a small repository made here with a known feature (`discount`,
called from its own module and from another one that imports it), mined with `flywheel tasks mine --mode feature`.

Its task is judged both ways (the reference restores it: every kept test passes; nothing restored, the definition
alone, or one file of two restored: they fail), and re-verified as stored tasks are. `checkout` is called only from
code no test reaches, so its tests pass with its definition back and its call gone: rejected as
passes_without_call_sites; `is_cheap` is called in an `if` header: rejected as unremovable_call_site.
"""

from __future__ import annotations

import json

import pytest

from online_rl.tasks.mining import cli, store
from online_rl.tasks.mining.judge import judge
from online_rl.tasks.mining.verify import recheck
from tests import mined_repo

pytestmark = pytest.mark.timeout(180)

PRICING = (
    mined_repo.PRICING
    + '''

def is_cheap(price):
    """Under ten."""
    limit = 10
    below = price < limit
    return below


def shelf(prices):
    """The cheap ones."""
    out = []
    for p in prices:
        if is_cheap(p):
            out.append(p)
    return out
'''
)

CART = (
    '"""The cart."""\nfrom shop.pricing import checkout, discount\n\n\n'
    + mined_repo.RECEIPT
    + "\n\ndef basket(prices):\n    return checkout(prices, 0)\n"
)

TESTS = """\
import unittest

from shop.cart import receipt
from shop.pricing import checkout


class ShopTest(unittest.TestCase):
    def test_checkout(self):
        self.assertEqual(checkout([10, 20], 50), 15.0)

    def test_receipt(self):
        self.assertEqual(receipt(40, 25), "total 30.00")

    def test_checkout_rejects_a_bad_percent(self):
        with self.assertRaises(ValueError):
            checkout([1], 120)
"""


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    shop = {"shop/__init__.py": "", "shop/pricing.py": PRICING, "shop/cart.py": CART, "tests/test_shop.py": TESTS}
    repo = mined_repo.write_repo(tmp_path_factory.mktemp("shop"), shop)
    mined_repo.commit(repo, "shop")
    out = repo.parent / "out"
    assert cli.main(["tasks", "mine", str(repo), "--mode", "feature", "--out", str(out), "--no-progress"]) == 0
    folder = out / f"{repo.name}-feature"
    summary = json.loads((folder / "summary.json").read_text())
    rejected = {json.loads(line)["candidate"]: json.loads(line) for line in open(folder / "rejected.jsonl")}
    return store.load([folder / "tasks.jsonl"]), rejected, summary


def test_the_feature_is_mined_with_its_call_sites(mined):
    tasks, _, summary = mined
    (task,) = tasks
    assert isinstance(task, store.FeatureTask) and task.qualname == "discount" and task.path == "shop/pricing.py"
    assert set(task.test_ids) == {
        "test_shop.ShopTest.test_checkout",
        "test_shop.ShopTest.test_receipt",
        "test_shop.ShopTest.test_checkout_rejects_a_bad_percent",
    }
    removed = {(c["path"], c["kind"], c["removed"].strip()) for c in task.call_sites}
    assert ("shop/pricing.py", "call", "p = discount(p, percent)") in removed
    assert ("shop/cart.py", "call", "now = discount(price, percent)") in removed
    assert ("shop/cart.py", "import", "from shop.pricing import checkout, discount") in removed
    shown = task.shown
    assert "discount" not in shown["shop/cart.py"] and "from shop.pricing import checkout\n" in shown["shop/cart.py"]
    assert "# TODO(restore): `discount`" in shown["shop/pricing.py"] and "def discount" not in shown["shop/pricing.py"]
    assert "test_" not in task.prompt and "assert" not in task.prompt  # the hidden tests are never shown
    assert summary["mode"] == "feature" and summary["valid"] == 1 and summary["sandbox_s_per_task"] > 0


def test_each_rejection_says_why(mined):
    _, rejected, summary = mined
    assert rejected["shop/pricing.py::is_cheap"]["reason"] == "unremovable_call_site"
    assert "header of a If" in rejected["shop/pricing.py::is_cheap"]["detail"]
    assert rejected["shop/pricing.py::checkout"]["reason"] == "passes_without_call_sites"
    assert summary["rejected"]["no_call_sites"] == 2  # shelf, receipt
    assert summary["rejected"]["unremovable_call_site"] == 1 and summary["rejected"]["passes_without_call_sites"] == 1


def test_the_task_is_judged_both_ways_in_the_sandbox(mined):
    (task,), _, _ = mined
    half = {**task.shown, "shop/pricing.py": task.reference["shop/pricing.py"]}  # the callers in cart.py still gone
    reference, answer, nothing, definition_only, one_file = judge(
        [(task, None), (task, task.answer), (task, task.shown), (task, task.files_without_calls()), (task, half)]
    )
    assert reference.ok and answer.ok, (reference, answer)
    assert nothing.reward == 0.0 and not definition_only.ok and not one_file.ok
    assert one_file.passed == 2  # checkout's tests pass; the receipt still is not discounted
    kept, rejected, seconds = recheck([task])
    assert [t.test_ids for t in kept] == [task.test_ids] and not rejected and seconds > 0
