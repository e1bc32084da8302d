"""What the mining tests on small repositories made here share (tests/integration/online_rl/tasks/test_mining*.py,
tests/integration/flywheel/demo/test_agent_session_mined.py): `write_repo` lays out a repository's files, `commit`
makes it a git repository with one commit (the provenance mining records); PRICING and RECEIPT are the shop
repository's `discount` (called from `checkout` and from the cart's `receipt`), which the feature and agent tests
extend each their own way."""

from __future__ import annotations

import subprocess
from pathlib import Path

PRICING = '''\
"""Prices."""


def discount(price, percent):
    """The price less `percent` per cent, never below zero."""
    if percent < 0 or percent > 100:
        raise ValueError("percent")
    cut = price * percent / 100
    return max(price - cut, 0)


def checkout(prices, percent):
    """The total of a basket, each price discounted."""
    total = 0
    for p in prices:
        p = discount(p, percent)
        total += p
    return round(total, 2)
'''

RECEIPT = '''\
def receipt(price, percent):
    """A receipt line."""
    now = price
    now = discount(price, percent)
    return f"total {now:.2f}"
'''


def write_repo(root: Path, files: dict[str, str]) -> Path:
    """Writes each file (a path relative to `root`: its text), making the folders; returns root."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def commit(repo: Path, message: str) -> str:
    """`git init` and one commit of everything in `repo`; returns the commit's hash."""
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
