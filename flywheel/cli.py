"""`flywheel`: one command line; each package adds its own subcommands through a `register` function.

A package's `cli` module exposes `register(subparsers)`; it must stay cheap to import (no torch,
no sglang at import time) so that `flywheel --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Packages that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = [
    "flywheel.kafka.cli",
    "flywheel.hosts.cli",
    "online_rl.cli",
    "serving.cli",
    "weight_sync.cli",
    "flywheel.demo.run",
    "flywheel.observe.command",
    "flywheel.chaos.run",
    "loadtests.cli",
    "flywheel.status.screen",
    "flywheel.tenants_cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
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
