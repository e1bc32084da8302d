"""Run every benchmarks/*.py module, save each JSON result, and refresh the manual's results table.

Each benchmark runs in its own process (`python -m benchmarks.NAME`), prints one JSON object as the
last line of its output, and that object is written to benchmarks/results/NAME.json; the table between
the markers of docs/benchmarks.md is rewritten from them all.
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
PAGE = HERE.parent / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


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


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        elif not isinstance(v, list):
            rows.append((f"{prefix}{k}", v))
    return rows


def table() -> str:
    lines = ["| benchmark | metric | value |", "|---|---|---|"]
    for f in sorted(RESULTS.glob("*.json")):
        r = json.loads(f.read_text())
        for k, v in _flatten(r):
            if k != "benchmark":
                cell = str(v).replace("\n", "\\n").replace("|", "\\|")  # one table row per value
                cell = f"`{cell}`" if "<" in cell else cell  # a model's answer, not HTML
                lines.append(f"| {f.stem} | {k} | {cell} |")
    return "\n".join(lines)


def refresh_page() -> None:
    if not PAGE.exists():
        return
    text = PAGE.read_text()
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        PAGE.write_text(f"{head}{START}\n{table()}\n{END}{tail}")


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
    refresh_page()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
