"""Synthetic coding tasks: small Python functions described by a docstring, judged by hidden tests.

A task is one (family, constant, argument name) combination, e.g. family `add`, constant 3, argument
`x`: prompt `def add_three(x):\n    \"\"\"Return x plus 3.\"\"\"\n`, reference body `    return x + 3`.
The same generator feeds two disjoint sets, split by a seeded hash of the combination:
- the bootstrap corpus (`split="train"`), where a share of the bodies is deliberately wrong (plausible
  bugs: the wrong operator, an off-by-one constant), so the base model samples correct code only
  part of the time and RL has room to improve it;
- held-out tasks (`split="heldout"`) for sandbox rollouts and evaluation, never seen in the corpus.
`hint_for` says what a user says about a body that failed (the corpus, online_rl.tasks.corpus, puts such hints
before reference bodies, so that the model learns to follow one).
Correctness is judged by running the code on inputs and comparing with the reference body's outputs,
never by matching the reference text.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from online_rl.tasks.family import Family
from online_rl.tasks.multiline import MULTILINE_FAMILIES

NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
ARG_NAMES = {
    "int": ("x", "n", "value", "num", "a"),
    "list": ("values", "items", "nums", "xs", "data"),
    "str": ("s", "text", "word", "name", "line"),
}


FAMILIES: tuple[Family, ...] = (
    Family(
        "add",
        "int",
        "add_{w}",
        ("Return {a} plus {k}.", "Add {k} to {a}."),
        "return {a} + {k}",
        ("return {a} - {k}", "return {a} + {k1}", "return {a} * {k}"),
    ),
    Family(
        "sub",
        "int",
        "minus_{w}",
        ("Return {a} minus {k}.", "Subtract {k} from {a}."),
        "return {a} - {k}",
        ("return {k} - {a}", "return {a} - {k1}", "return {a} + {k}"),
    ),
    Family(
        "mul",
        "int",
        "times_{w}",
        ("Return {a} multiplied by {k}.", "Multiply {a} by {k}."),
        "return {a} * {k}",
        ("return {a} + {k}", "return {a} * {k1}", "return {a} ** {k}"),
    ),
    Family(
        "floordiv",
        "int",
        "div_{w}",
        ("Return {a} divided by {k}, rounded down.", "Integer-divide {a} by {k}."),
        "return {a} // {k}",
        ("return {a} / {k}", "return {a} % {k}", "return {a} // {k1}"),
    ),
    Family(
        "mod",
        "int",
        "mod_{w}",
        ("Return the remainder of {a} divided by {k}.", "Return {a} modulo {k}."),
        "return {a} % {k}",
        ("return {a} // {k}", "return {k} % {a}", "return {a} % {k1}"),
    ),
    Family(
        "divisible",
        "int",
        "is_multiple_of_{w}",
        ("Return True if {a} is divisible by {k}.", "Check whether {k} divides {a}."),
        "return {a} % {k} == 0",
        ("return {a} % {k} != 0", "return {a} // {k} == 0", "return {a} % {k1} == 0"),
    ),
    Family(
        "greater",
        "int",
        "above_{w}",
        ("Return True if {a} is greater than {k}.", "Check whether {a} exceeds {k}."),
        "return {a} > {k}",
        ("return {a} >= {k}", "return {a} < {k}", "return {a} > {k1}"),
    ),
    Family(
        "cap",
        "int",
        "cap_at_{w}",
        ("Return {a}, but at most {k}.", "Clamp {a} to be no larger than {k}."),
        "return min({a}, {k})",
        ("return max({a}, {k})", "return min({a}, {k1})", "return {a}"),
    ),
    Family(
        "floor",
        "int",
        "at_least_{w}",
        ("Return {a}, but at least {k}.", "Clamp {a} to be no smaller than {k}."),
        "return max({a}, {k})",
        ("return min({a}, {k})", "return max({a}, {k1})", "return {a} + {k}"),
    ),
    Family(
        "square_plus",
        "int",
        "square_plus_{w}",
        ("Return the square of {a} plus {k}.",),
        "return {a} * {a} + {k}",
        ("return ({a} + {k}) * {a}", "return {a} * {a} + {k1}", "return {a} * {k}"),
    ),
    Family(
        "sum_times",
        "list",
        "sum_times_{w}",
        ("Return the sum of {a} multiplied by {k}.",),
        "return sum({a}) * {k}",
        ("return sum({a}) + {k}", "return len({a}) * {k}", "return sum({a}) * {k1}"),
    ),
    Family(
        "count",
        "list",
        "count_{w}s",
        ("Return how many times {k} appears in {a}.", "Count the occurrences of {k} in {a}."),
        "return {a}.count({k})",
        ("return len({a})", "return {a}.index({k})", "return {a}.count({k1})"),
    ),
    Family(
        "keep_greater",
        "list",
        "keep_above_{w}",
        ("Return the items of {a} greater than {k}.", "Keep only the elements of {a} that exceed {k}."),
        "return [v for v in {a} if v > {k}]",
        (
            "return [v for v in {a} if v < {k}]",
            "return [v for v in {a} if v >= {k}]",
            "return [v for v in {a} if v > {k1}]",
        ),
    ),
    Family(
        "scale",
        "list",
        "scale_by_{w}",
        ("Return each item of {a} multiplied by {k}.", "Multiply every element of {a} by {k}."),
        "return [v * {k} for v in {a}]",
        ("return [v + {k} for v in {a}]", "return {a} * {k}", "return [v * {k1} for v in {a}]"),
    ),
    Family(
        "shift",
        "list",
        "shift_by_{w}",
        ("Return each item of {a} plus {k}.", "Add {k} to every element of {a}."),
        "return [v + {k} for v in {a}]",
        ("return [v * {k} for v in {a}]", "return {a} + [{k}]", "return [v + {k1} for v in {a}]"),
    ),
    Family(
        "head",
        "list",
        "first_{w}",
        ("Return the first {k} items of {a}.",),
        "return {a}[:{k}]",
        ("return {a}[{k}:]", "return {a}[:{k1}]", "return {a}[-{k}:]"),
    ),
    Family(
        "tail",
        "list",
        "last_{w}",
        ("Return the last {k} items of {a}.",),
        "return {a}[-{k}:]",
        ("return {a}[:{k}]", "return {a}[-{k1}:]", "return {a}[{k}:]"),
    ),
    Family(
        "max_plus",
        "list",
        "max_plus_{w}",
        ("Return the largest item of {a} plus {k}.",),
        "return max({a}) + {k}",
        ("return min({a}) + {k}", "return max({a}) * {k}", "return max({a}) + {k1}"),
    ),
    Family(
        "repeat",
        "str",
        "repeat_{w}",
        ("Return {a} repeated {k} times.",),
        "return {a} * {k}",
        ("return {a} * {k1}", "return {a} + str({k})", "return {a}"),
    ),
    Family(
        "prefix",
        "str",
        "prefix_{w}",
        ("Return the first {k} characters of {a}.",),
        "return {a}[:{k}]",
        ("return {a}[{k}:]", "return {a}[:{k1}]", "return {a}[-{k}:]"),
    ),
    Family(
        "suffix",
        "str",
        "suffix_{w}",
        ("Return the last {k} characters of {a}.",),
        "return {a}[-{k}:]",
        ("return {a}[:{k}]", "return {a}[-{k1}:]", "return {a}[{k}:]"),
    ),
    Family(
        "shout",
        "str",
        "shout_{w}",
        ("Return {a} in upper case followed by {k} exclamation marks.",),
        "return {a}.upper() + '!' * {k}",
        ("return {a} + '!' * {k}", "return {a}.upper() + '!' * {k1}", "return {a}.lower() + '!' * {k}"),
    ),
)
FAMILY_BY_KEY = {f.key: f for f in FAMILIES + MULTILINE_FAMILIES}
CONSTANTS = tuple(NUMBER_WORDS)


@dataclass(frozen=True)
class Task:
    family: str
    k: int
    arg: str
    doc_variant: int = 0

    @property
    def spec(self) -> Family:
        return FAMILY_BY_KEY[self.family]

    @property
    def name(self) -> str:
        return self.spec.name.format(w=NUMBER_WORDS[self.k])

    @property
    def task_id(self) -> str:
        return f"{self.family}-{self.k}-{self.arg}"

    @property
    def prompt(self) -> str:
        """Signature and docstring: what an IDE shows before the cursor."""
        doc = self.spec.docs[self.doc_variant % len(self.spec.docs)].format(a=self.arg, k=self.k)
        return f'def {self.name}({self.arg}):\n    """{doc}"""\n'

    def render_body(self, template: str) -> str:
        lines = template.format(a=self.arg, k=self.k, k1=self.k + 1).split("\n")
        return "".join(f"    {line}\n" for line in lines)

    @property
    def reference(self) -> str:
        return self.render_body(self.spec.body)

    def wrong_bodies(self) -> list[str]:
        return [self.render_body(w) for w in self.spec.wrong]

    def test_inputs(self) -> list[object]:
        """Inputs the hidden tests call the function with (deterministic, include edge cases)."""
        rng = random.Random(_stable_hash(self.task_id))
        kind = self.spec.kind
        if kind == "int":
            base = [0, 1, self.k, self.k + 1, -3, 17]
            return base + [rng.randint(-50, 100) for _ in range(4)]  # type: ignore[return-value]  # model code
        if kind == "list":
            base = [[1, 2, 3], [self.k, self.k, 1], [9, 0, self.k + 1, 4, self.k, 12, 5, 7, 3, 8]]  # type: ignore[list-item]  # model code
            return base + [[rng.randint(-5, 15) for _ in range(rng.randint(1, 12))] for _ in range(4)]
        words = ["hello", "ab", "flywheel", "x", "Python3", "coding model"]
        return words + ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 12))) for _ in range(3)]  # type: ignore[return-value]  # model code

    def expected_outputs(self) -> list[object]:
        """The reference body's outputs on test_inputs (computed in-process: it is our own code)."""
        ns: dict = {}
        exec(self.prompt + self.reference, ns)  # noqa: S102 - trusted reference implementation
        return [_call(ns[self.name], x) for x in self.test_inputs()]

    def test_source(self) -> str:
        """Human-readable tests, as they appear in the corpus (the sandbox does not use this text)."""
        lines = [f"def test_{self.name}():"]
        for x, y in list(zip(self.test_inputs(), self.expected_outputs()))[:3]:
            lines.append(f"    assert {self.name}({x!r}) == {y!r}")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ hints
HINT_PREFIX = "# hint: "
_NUMBER = re.compile(r"\d+")


def _return_expr(body: str) -> str | None:
    """The expression of a body's first `return` line (None: no such line)."""
    for line in body.split("\n"):
        if line.strip().startswith("return "):
            return line.strip()[len("return ") :].strip()
    return None


def hint_for(task: Task, completion: str) -> str:
    """What a user who knows what the function must do says about a body that failed its hidden tests, in
    the hint language the corpus teaches: the right code with a wrong constant -> "use 3, not 4"; anything
    else -> "use <the code it should have>": for a one-line body the expression it should return ("use x + 3"),
    for a multi-line one the first line that is wrong, as it should read ("use if v > 3:"; a return line
    without its `return`, as in one-line hints)."""
    if "\n" in task.spec.body:
        return _multiline_hint(task, completion)
    want = _return_expr(task.reference)
    got = _return_expr(completion)
    if got is not None and got != want and _NUMBER.sub("#", got) == _NUMBER.sub("#", want):  # type: ignore[arg-type]  # model code
        wrong = [g for g, w in zip(_NUMBER.findall(got), _NUMBER.findall(want)) if g != w]  # type: ignore[arg-type]  # model code
        if wrong:
            return f"use {task.k}, not {wrong[0]}"
    return f"use {want}"


def _multiline_hint(task: Task, completion: str) -> str:
    want_lines = [line.strip() for line in task.reference.split("\n") if line.strip()]
    got_lines = [line.strip() for line in completion.split("\n") if line.strip()]  # blank lines say nothing
    # The first line that differs (a body that matches line for line but fails, e.g. by running on past the
    # function, gets its last line named).
    i = next((i for i, w in enumerate(want_lines) if i >= len(got_lines) or got_lines[i] != w), len(want_lines) - 1)
    want = want_lines[i]
    got = got_lines[i] if i < len(got_lines) else ""
    if got != want and _NUMBER.sub("#", got) == _NUMBER.sub("#", want):
        wrong = [(g, w) for g, w in zip(_NUMBER.findall(got), _NUMBER.findall(want)) if g != w]
        if wrong:
            return f"use {wrong[0][1]}, not {wrong[0][0]}"
    return "use " + (want[len("return ") :] if want.startswith("return ") else want)


def hint_line(hint: str) -> str:
    """The hint as the comment line inserted before the body (in the corpus, and in the teacher's context)."""
    return f"    {HINT_PREFIX}{hint}\n"


def _call(fn, x):
    try:
        return fn(list(x) if isinstance(x, list) else x)
    except Exception as e:  # the reference may raise too (e.g. max of an empty list): part of its contract
        return f"<raises {type(e).__name__}>"


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class TaskSplit:
    """Which (family, constant, argument) combinations are held out from the corpus."""

    seed: int = 0
    heldout_share: float = 0.2

    def is_heldout(self, family: str, k: int, arg: str) -> bool:
        h = _stable_hash(f"{self.seed}/{family}/{k}/{arg}") % 10_000
        return h < self.heldout_share * 10_000


# Which families a set of tasks draws from: the one-line ones (every preset's corpus), the multi-line ones
# (online_rl.tasks.multiline: the demo's corpus has them too), or both.
FAMILY_SETS = {"single": FAMILIES, "multiline": MULTILINE_FAMILIES, "all": FAMILIES + MULTILINE_FAMILIES}


def completion_tokens(families: str) -> int:
    """New tokens a completion of this family set needs: a one-line body ends within 40, a multi-line one is up
    to ~50 tokens."""
    return 40 if family_set(families) is FAMILIES else 64


def all_combinations(families: str = "single") -> list[tuple[str, int, str]]:
    return [(f.key, k, a) for f in family_set(families) for k in CONSTANTS for a in ARG_NAMES[f.kind]]


def family_set(families: str) -> tuple[Family, ...]:
    if families not in FAMILY_SETS:
        raise ValueError(f"unknown family set {families!r}; choose from {sorted(FAMILY_SETS)}")
    return FAMILY_SETS[families]


def tasks(split: str, seed: int = 0, heldout_share: float = 0.2, families: str = "single") -> list[Task]:
    """Tasks of one split ("train" or "heldout") of a family set ("single", "multiline", "all"); held-out
    tasks use docstring phrasing 0."""
    sp = TaskSplit(seed, heldout_share)
    want = split == "heldout"
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split {split!r}")
    return [Task(f, k, a) for f, k, a in all_combinations(families) if sp.is_heldout(f, k, a) == want]


FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, EOS = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"
SPECIAL_TOKENS = [EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE]


def fim_prompt(prefix: str, suffix: str) -> str:
    """Prefix-suffix-middle order, as Qwen/StarCoder-style coders are trained."""
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"
