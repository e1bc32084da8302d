"""The tests mirror the packages (tests/README.md): a test of package P (or of its subpackage P/Q) lives under
tests/unit/P/ (tests/unit/P/Q/), or tests/integration/P/ when it needs real servers; tests of the repository as a
whole (import layers, module sizes, dependencies, this one) under tests/unit/repo/. No test file sits directly
under tests/unit/ or tests/integration/, and every folder a test sits in names a package folder that exists."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
REPO_ROOT = TESTS.parent
WHOLE_REPO = "repo"  # tests/unit/repo/: the repository as a whole, no one package


def _test_files(kind: str) -> list[Path]:
    return sorted((TESTS / kind).rglob("test_*.py"))


def test_no_test_file_sits_directly_under_unit_or_integration():
    loose = [str(p.relative_to(REPO_ROOT)) for kind in ("unit", "integration") for p in (TESTS / kind).glob("*.py")]
    assert not loose, (
        f"move these into the folder of the package they test (tests/unit/<package>/..., see tests/README.md): {loose}"
    )


def test_every_test_folder_mirrors_a_package():
    misplaced = []
    for kind in ("unit", "integration"):
        for path in _test_files(kind):
            folder = path.parent.relative_to(TESTS / kind)
            if kind == "unit" and folder.parts[:1] == (WHOLE_REPO,):
                continue
            if not (REPO_ROOT / folder / "__init__.py").is_file():
                misplaced.append(f"{path.relative_to(REPO_ROOT)} ({folder} is no package of the repository)")
    assert not misplaced, misplaced
