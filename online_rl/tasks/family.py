"""A task family: what every task of one kind shares (its argument type, name and docstring templates, the
reference body and the plausible wrong ones). The families themselves are in online_rl.tasks.synthetic (one
line) and online_rl.tasks.multiline (several lines, one of them wrong)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    key: str
    kind: str  # argument type: int | list | str
    name: str  # function name template; {w} is the constant as a word
    docs: tuple[str, ...]  # docstring phrasings; {a} the argument, {k} the constant
    body: str  # reference body (one or more lines, no indent); {a}, {k}
    wrong: tuple[str, ...]  # plausible wrong bodies; {k1} is k + 1
