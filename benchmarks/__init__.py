"""Benchmarks: each module prints one JSON object as its last line; `python -m benchmarks` runs them all."""
