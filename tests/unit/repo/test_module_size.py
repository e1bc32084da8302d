"""Small files with one job each: a module over ~400 lines says at its top why it is one file."""

import ast

from infra.paths import REPO_ROOT

LIMIT = 420  # ~400, with room for a docstring
PACKAGES = (
    "infra",
    "contracts",
    "admin_api",
    "weight_patch",
    "flywheel",
    "serving",
    "online_rl",
    "weight_sync",
    "kernels",
    "loadtests",
    "benchmarks",
    "tests",
)


def test_long_modules_say_why_they_are_one_file():
    unexplained = []
    for pkg in PACKAGES:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") > LIMIT and "Why one file:" not in (ast.get_docstring(ast.parse(text)) or ""):
                unexplained.append(f"{path.relative_to(REPO_ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, "split these, or say at the top why each is one file: " + ", ".join(unexplained)
