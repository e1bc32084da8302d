"""Run every benchmarks/*.py module and save each JSON result.

Each benchmark runs in its own process (`python -m benchmarks.NAME`), prints one JSON object as the
last line of its output, and that object is written to benchmarks/results/NAME.json. The manual's
Benchmarks page (docs/benchmarks.md) and its other tables of figures are rendered from these files when
the site is built (docs/hooks/figures.py), so a run changes them at the next `make docs`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def modules() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def run_one(name: str) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode})")
    result = json.loads(lines[-1])
    result.setdefault("benchmark", name)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("names", nargs="*", help=f"subset of {modules()}")
    args = ap.parse_args()
    failed = []
    for name in args.names or modules():
        print(f"=== benchmark {name}", flush=True)
        try:
            print(json.dumps(run_one(name)), flush=True)
        except Exception as e:  # keep going: one broken benchmark should not hide the others
            print(f"benchmark {name}: {e}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
