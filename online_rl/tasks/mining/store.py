"""Mined tasks as JSON lines, each with its provenance; the hidden tests stay out of what the model sees.

A MinedTask is one deleted body: its prompt is the file up to the body (everything above, the signature and the
docstring: what an IDE shows before the cursor), its suffix the rest of the file, its reference the deleted body.
The tests that judge it (the test file, by path in its source, and the test ids kept) are provenance and judging
material only: no field the prompt is made of holds them, as the synthetic tasks' hidden tests never reach theirs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from online_rl.tasks.synthetic import fim_prompt


@dataclass(frozen=True)
class MinedTask:
    task_id: str  # source/path::qualname
    source: str  # e.g. "stdlib", "toolz"
    version: str  # release, Debian version or commit
    origin: str  # how to fetch the same bytes again
    root: str  # the source's folder on this machine (the judge reads the files from there)
    path: str  # the code file, relative to root
    qualname: str
    lineno: int
    prefix: str  # shown: the file up to the body
    suffix: str  # shown (fill-in-the-middle): the file after the body
    reference: str  # the deleted body
    indent: str
    test_path: str  # hidden: the test file, relative to root
    test_module: str  # hidden: its dotted name
    test_ids: tuple[str, ...]  # hidden: the tests that fail without the body and pass with it
    paths: tuple[str, ...]  # sys.path roots in the jail
    fresh: tuple[str, ...]  # modules imported afresh there
    ship_all: bool  # every file of the source travels into the jail (else the code and test files only)
    code_sha256: str  # of the original code file: a changed cache is seen, not judged against
    sandbox_s: float  # sandbox seconds its mining took (its share of the baseline included)

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def prompt(self) -> str:
        """What the model continues: the file up to the body (signature and docstring last, as in synthetic tasks)."""
        return self.prefix

    @property
    def fim(self) -> str:
        """The same as fill-in-the-middle: prefix and suffix around the missing body."""
        return fim_prompt(self.prefix, self.suffix)

    def code_with(self, body: str) -> str:
        """The code file with `body` (a completion) where the reference was."""
        return self.prefix + body + ("" if body.endswith("\n") else "\n") + self.suffix

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> MinedTask:
        raw = json.loads(line)
        for key in ("test_ids", "paths", "fresh"):
            raw[key] = tuple(raw[key])
        return cls(**raw)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def save(tasks: Iterable[MinedTask], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path.with_suffix(".part"), "w") as f:
        for t in tasks:
            f.write(t.to_json() + "\n")
            n += 1
    path.with_suffix(".part").replace(path)
    return n


def load(paths: Iterable[Path]) -> list[MinedTask]:
    out = []
    for path in paths:
        with open(path) as f:
            out += [MinedTask.from_json(line) for line in f if line.strip()]
    return out
