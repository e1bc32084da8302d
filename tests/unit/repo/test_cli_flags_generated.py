"""Config has one source (infra.config): every `--flag` of every command is generated from a config's
`option()` fields (add_flags / build), never added to a parser by hand, so a default, a help text or an
environment variable is written once, beside the field. Positionals and subcommands are written where the
command is (a positional is not an option)."""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.config import add_flags, build, option
from infra.paths import REPO_ROOT
from tests.import_graph import SHIPPED

PRODUCTION = SHIPPED  # loadtests is a command too
# Where flags are made from the options: the one place add_argument takes a flag.
GENERATOR = "infra/config.py"
# `flywheel -v/--verbose`: the one global flag, with a short alias (generated flags have none).
ALLOWED = {"flywheel/cli.py"}


def _hand_flags(path: Path) -> list[str]:
    """The flags `path` adds itself: `.add_argument("-...", ...)` with the flag written as a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("-"):
                found.append(f"{first.value} (line {node.lineno})")
    return found


def _by_file() -> dict[str, list[str]]:
    out = {}
    for pkg in PRODUCTION:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(REPO_ROOT))
            if rel != GENERATOR and (flags := _hand_flags(path)):
                out[rel] = flags
    return out


def test_no_command_adds_a_flag_by_hand():
    found = _by_file()
    by_hand = {f: flags for f, flags in found.items() if f not in ALLOWED}
    assert not by_hand, f"declare these as option() fields of the command's config and add_flags them: {by_hand}"
    assert set(found) == ALLOWED, "the allowed file no longer adds its flag: take it off ALLOWED"


def test_the_scan_sees_a_flag_added_by_hand(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('def f(p):\n    p.add_argument("n")\n    p.add_argument("--x", type=int)\n    p.add_argument(f)\n')
    assert _hand_flags(src) == ["--x (line 3)"]


@dataclass
class _Cmd:
    name: str = option(help="required: no default")
    home: str | None = option(None, env="FLYWHEEL_TEST_HOME", help="optional")


def test_an_option_without_a_default_is_a_required_flag(capsys):
    p = argparse.ArgumentParser()
    add_flags(p, _Cmd)
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert "--name" in capsys.readouterr().err
    assert build(_Cmd, p.parse_args(["--name", "a"])) == _Cmd(name="a", home=None)
    assert "(default" not in p.format_help().split("--name NAME")[1].split("--home")[0]
