"""Runs tests/unit/kernels/triton_checks.py under Triton's interpreter, in a process of its own: Triton decides at
import time whether it interprets, so TRITON_INTERPRET=1 must be set before anything imports it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(300)
def test_triton_kernels_under_the_interpreter():
    here = Path(__file__).parent
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "triton_checks.py")],
        cwd=here.parents[2],  # the repository root
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
