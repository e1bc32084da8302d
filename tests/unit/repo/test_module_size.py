"""Small files with one job each: a module over 400 lines says at its top why it is one file ("Why one file:" in its
docstring), and no module so exempted grows past 500 lines: past that it is split along its seams."""

import ast

from infra.paths import REPO_ROOT
from tests.import_graph import ALL_PACKAGES

LIMIT = 400
EXEMPT_LIMIT = 500  # the most a module that says why it is one file may have
PACKAGES = ALL_PACKAGES


def _long_modules() -> list[tuple[str, int, bool]]:
    """(path, lines, says why it is one file) of every module over LIMIT lines."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.count("\n")
            if lines > LIMIT:
                says_why = "Why one file:" in (ast.get_docstring(ast.parse(text)) or "")
                out.append((str(path.relative_to(REPO_ROOT)), lines, says_why))
    return out


def test_long_modules_say_why_they_are_one_file():
    unexplained = [f"{path} ({lines} lines)" for path, lines, says_why in _long_modules() if not says_why]
    assert not unexplained, "split these, or say at the top why each is one file: " + ", ".join(unexplained)


def test_no_exempted_module_is_over_the_exemption_limit():
    too_long = [
        f"{path} ({lines} lines)" for path, lines, says_why in _long_modules() if says_why and lines > EXEMPT_LIMIT
    ]
    assert not too_long, f"over {EXEMPT_LIMIT} lines even with a reason: split these along their seams: " + ", ".join(
        too_long
    )
