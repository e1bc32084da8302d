"""Mined tasks as JSON lines, each with its provenance; the hidden tests stay out of what the model sees.

A MinedTask is one deleted body: its prompt is the file up to the body (everything above, the signature and the
docstring: what an IDE shows before the cursor), its suffix the rest of the file, its reference the deleted body.
The tests that judge it (the test file, by path in its source, and the test ids kept) are provenance and judging
material only: no field the prompt is made of holds them, as the synthetic tasks' hidden tests never reach theirs.

A FeatureTask (`flywheel tasks mine --mode feature`) is one deleted feature: a function's definition and the
statements that called it (online_rl.tasks.mining.features). It shows the changed files as they are after the
deletion (`shown`, a marker comment where the definition was) and its answer is each changed file's whole restored
text (`reference`); `call_sites` says what was removed where. In one completion (ANSWER_FORMAT) each file follows a
line `### PATH`; with one changed file the header may be left out. Only the changed files are taken from an answer:
it cannot replace a test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from online_rl.tasks.mining.candidates import apply_edits, source_lines
from online_rl.tasks.synthetic import fim_prompt


class _Stored:
    """One JSON line per task (either kind, a dataclass): its fields, the tuple ones read back as tuples."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, line: str) -> Self:
        raw = json.loads(line)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if str(f.type).startswith("tuple") and f.name in raw:
                raw[f.name] = tuple(raw[f.name])
        return cls(**raw)


@dataclass(frozen=True)
class MinedTask(_Stored):
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


ANSWER_FORMAT = "the whole restored text of each changed file, each after a line `### PATH` (one file: no header)"


def as_sections(files: dict[str, str]) -> str:
    """Files in the answer's format, by path: a file that does not end with a newline gets one, so the next header
    starts a line of its own (and reads back with it, as an editor saves the file)."""
    return "".join(f"### {p}\n{t}" + ("" if not t or t.endswith("\n") else "\n") for p, t in sorted(files.items()))


@dataclass(frozen=True)
class FeatureTask(_Stored):
    task_id: str  # source/path::qualname
    source: str
    version: str
    origin: str
    root: str
    path: str  # the file the definition was in
    qualname: str
    lineno: int
    shown: dict[str, str]  # shown: every changed file after the deletion
    reference: dict[str, str]  # the answer: the same files as they were
    call_sites: tuple[dict, ...]  # provenance: each removal (path, line, kind: definition | call | import, removed)
    test_path: str  # hidden, as MinedTask's
    test_module: str
    test_ids: tuple[str, ...]  # hidden: fail without the feature, with its body empty and with its calls gone
    paths: tuple[str, ...]
    fresh: tuple[str, ...]
    ship_all: bool
    code_sha256: dict[str, str]  # of each changed file as it was
    sandbox_s: float
    mode: str = "feature"

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def ask(self) -> str:
        where = ", ".join(sorted(self.shown))
        return (
            f"The function `{self.qualname}` was deleted from {self.path}, with the statements that called it "
            f"(in {where}). Restore the feature: write back {ANSWER_FORMAT}."
        )

    @property
    def prompt(self) -> str:
        """The ask, then each changed file as it is now, in the answer's format."""
        return self.ask + "\n\n" + as_sections(self.shown)

    def files_of(self, answer: str | dict[str, str]) -> dict[str, str]:
        """The changed files an answer restores (a file it leaves out stays as shown; any other file is ignored)."""
        if isinstance(answer, dict):
            return {p: answer.get(p, t) for p, t in self.shown.items()}
        heads = list(re.finditer(r"^### (\S+\.py)[ \t]*\n", answer, re.M))
        if not heads:
            return {self.path: answer} if len(self.shown) == 1 else dict(self.shown)
        out = dict(self.shown)
        for h, nxt in zip(heads, heads[1:] + [None]):
            if h.group(1) in self.shown:
                out[h.group(1)] = answer[h.end() : nxt.start() if nxt else len(answer)]
        return out

    def files_without_calls(self) -> dict[str, str]:
        """The reference with the call sites (and imports) removed and the definition in place."""
        return {
            p: apply_edits(
                t,
                [
                    (e["line"], e["line"] + len(source_lines(e["removed"])) - 1, e["text"])
                    for e in self.call_sites
                    if e["path"] == p and e["kind"] != "definition"
                ],
            )
            for p, t in self.reference.items()
        }

    @property
    def answer(self) -> str:
        """The reference in the answer's format."""
        return as_sections(self.reference)


def from_json(line: str) -> MinedTask | FeatureTask:
    """A stored task of either mode (a feature task's line says so)."""
    return FeatureTask.from_json(line) if json.loads(line).get("mode") == "feature" else MinedTask.from_json(line)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def save(tasks: Iterable[MinedTask | FeatureTask], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path.with_suffix(".part"), "w") as f:
        for t in tasks:
            f.write(t.to_json() + "\n")
            n += 1
    path.with_suffix(".part").replace(path)
    return n


def load(paths: Iterable[Path]) -> list[MinedTask | FeatureTask]:
    out: list[MinedTask | FeatureTask] = []
    for path in paths:
        with open(path) as f:
            out += [from_json(line) for line in f if line.strip()]
    return out
