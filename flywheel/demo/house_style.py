"""A cheaper preference than the hidden tests, judged by code in-process (load tests, chaos drills): the house style.

`HouseStyle` accepts a completion when the function, once completed, parses and its body is one `return` statement;
`parse_model_code` parses a model's code without letting Python's warnings about it reach the log.
"""

from __future__ import annotations

import warnings

from online_rl.tasks import synthetic as tasks


def parse_model_code(source: str):
    """ast.parse of a model's code, quietly: what Python warns about while parsing it ("invalid decimal literal",
    an invalid escape) is about the model's code, not ours. The filter names only this file name; it is put
    back when missing (a test harness resets the filters between tests), not at every call: adding a filter
    clears what the warnings module remembers having shown, and many users' threads parse at once."""
    import ast

    for category in (SyntaxWarning, DeprecationWarning):
        if not any(f[0] == "ignore" and f[2] is category and f[3] and f[3].pattern == _QUIET for f in warnings.filters):
            warnings.filterwarnings("ignore", category=category, module=_QUIET)
    return ast.parse(source, filename="<completion>")


_QUIET = r"<completion>\Z"  # the module name the warnings module gives code parsed under that file name


class HouseStyle:
    """A cheaper preference, judged by code in-process (for load tests, where a sandbox run per completion
    would load the machine under test): the function, once completed, parses and its body is a single
    `return` statement (the house style: one-expression helpers)."""

    def __call__(self, task: tasks.Task, completion: str) -> bool:
        import ast

        body = completion.split("\n\n", 1)[0]  # the function ends at its first blank line
        try:
            fn = parse_model_code(task.prompt + body).body[0]
        except (SyntaxError, IndexError, ValueError):
            return False
        stmts = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return len(stmts) == 1 and isinstance(stmts[0], ast.Return)
