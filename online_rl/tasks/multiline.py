"""Multi-line task families: bodies of three to six lines (a loop, a condition, an accumulator) where each wrong
body differs from the reference in exactly one line, so a failure is localised and a user's comment can name
the line that is wrong (online_rl.tasks.synthetic.hint_for: `use if v > 3:`, `use 3, not 4`).

Why they exist: on the one-line families the accept/reject reward already says which tokens were wrong (the
whole body is the one line), so text feedback had nothing left to point at (#20). Here a failing completion of
~40 tokens is mostly right, and only a comment says where it is not.
"""

from __future__ import annotations

from online_rl.tasks.family import Family


def _one_line_off(body: str, *swaps: tuple[int, str]) -> tuple[str, ...]:
    """The wrong bodies: the reference with line `i` (0-based) replaced by `line`, one swap each. The indent of
    the line replaced is kept."""
    lines = body.split("\n")
    out = []
    for i, line in swaps:
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        out.append("\n".join(lines[:i] + [indent + line] + lines[i + 1 :]))
    return tuple(out)


def _family(key: str, kind: str, name: str, docs: tuple[str, ...], body: str, *swaps: tuple[int, str]) -> Family:
    return Family(key, kind, name, docs, body, _one_line_off(body, *swaps))


MULTILINE_FAMILIES: tuple[Family, ...] = (
    _family(
        "sum_above",
        "list",
        "sum_above_{w}",
        ("Return the sum of the items of {a} greater than {k}.", "Add up the elements of {a} that exceed {k}."),
        "total = 0\nfor v in {a}:\n    if v > {k}:\n        total += v\nreturn total",
        (2, "if v >= {k}:"),
        (3, "total += 1"),
        (2, "if v < {k}:"),
        (2, "if v > {k1}:"),
    ),
    _family(
        "count_below",
        "list",
        "count_below_{w}",
        ("Return how many items of {a} are less than {k}.", "Count the elements of {a} smaller than {k}."),
        "n = 0\nfor v in {a}:\n    if v < {k}:\n        n += 1\nreturn n",
        (2, "if v <= {k}:"),
        (3, "n += v"),
        (2, "if v > {k}:"),
        (4, "return n + 1"),
    ),
    _family(
        "clip_items",
        "list",
        "clip_at_{w}",
        ("Return {a} with every item greater than {k} replaced by {k}.",),
        "out = []\nfor v in {a}:\n    if v > {k}:\n        v = {k}\n    out.append(v)\nreturn out",
        (2, "if v < {k}:"),
        (3, "v = 0"),
        (2, "if v > {k1}:"),
        (3, "v = {k1}"),
    ),
    _family(
        "first_above",
        "list",
        "index_above_{w}",
        ("Return the index of the first item of {a} greater than {k}, or -1 if there is none.",),
        "for i, v in enumerate({a}):\n    if v > {k}:\n        return i\nreturn -1",
        (1, "if v >= {k}:"),
        (2, "return v"),
        (3, "return 0"),
        (1, "if v < {k}:"),
    ),
    _family(
        "even_times",
        "int",
        "even_times_{w}",
        ("Return {a} times {k} if {a} is even, otherwise {a} plus {k}.",),
        "if {a} % 2 == 0:\n    return {a} * {k}\nreturn {a} + {k}",
        (0, "if {a} % 2 == 1:"),
        (1, "return {a} + {k}"),
        (2, "return {a} - {k}"),
        (1, "return {a} * {k1}"),
    ),
    _family(
        "sum_to",
        "int",
        "sum_to_times_{w}",
        ("Return the sum of the numbers from 1 to {a}, multiplied by {k}.",),
        "total = 0\nfor i in range(1, {a} + 1):\n    total += i\nreturn total * {k}",
        (1, "for i in range(1, {a}):"),
        (2, "total += {k}"),
        (3, "return total + {k}"),
        (3, "return total * {k1}"),
    ),
    _family(
        "digit_sum",
        "int",
        "digit_sum_times_{w}",
        ("Return the sum of the digits of {a}, multiplied by {k}.",),
        "n = abs({a})\ntotal = 0\nwhile n > 0:\n    total += n % 10\n    n //= 10\nreturn total * {k}",
        (0, "n = {a}"),
        (3, "total += n"),
        (5, "return total + {k}"),
        (5, "return total * {k1}"),
    ),
    _family(
        "short_words",
        "str",
        "words_up_to_{w}",
        ("Return the words of {a} that have at most {k} characters.",),
        "words = []\nfor w in {a}.split():\n    if len(w) <= {k}:\n        words.append(w)\nreturn words",
        (2, "if len(w) > {k}:"),
        (3, "words.append(len(w))"),
        (1, "for w in {a}:"),
        (4, "return len(words)"),
    ),
    _family(
        "upper_head",
        "str",
        "upper_first_{w}",
        ("Return {a} with its first {k} characters in upper case.",),
        "head = {a}[:{k}].upper()\nrest = {a}[{k}:]\nreturn head + rest",
        (1, "rest = {a}[{k1}:]"),
        (0, "head = {a}[:{k}].lower()"),
        (2, "return rest + head"),
        (0, "head = {a}[:{k1}].upper()"),
    ),
)
