"""`flywheel`: one command line; each package adds its own subcommands through a `register` function.

A package's `cli` module exposes `register(subparsers)`; it must stay cheap to import (no torch,
no sglang at import time) so that `flywheel --help` is instant. The modules are named in pyproject.toml's
`flywheel.commands` entry points, not here: the command line imports no package by name, and a package above
it (loadtests) registers its command as any other does.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import entry_points

GROUP = "flywheel.commands"


def command_modules() -> list[str]:
    """The modules that register subcommands (pyproject.toml's entry points, as installed), in --help order."""
    found = sorted(entry_points(group=GROUP), key=lambda ep: ep.name)
    if not found:  # a checkout on the path, but not installed
        raise SystemExit(f"flywheel: no {GROUP} entry points installed: run `make setup` (pip install -e .)")
    return [ep.value for ep in found]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:
        for noisy in ("kafka", "httpx", "httpx2"):  # httpx2: what the anthropic SDK sends through
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, TimeoutError, FileNotFoundError, ValueError) as e:
        print(f"flywheel {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
