"""A weight store server for the weight-sync benchmarks (benchmarks.delta and its parts), with the fleet read
credential it wants."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.paths import REPO_ROOT
from infra.procs import free_port, wait_until
from weight_sync import fleet_credential

# The fleet read credential of the stores these benchmarks serve (weight_sync.fleet_credential).
STORE_TOKEN = fleet_credential.new()


def serve_store(store: Path) -> tuple[subprocess.Popen, str]:
    """`flywheel weights serve` on a free port, wanting STORE_TOKEN."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "weights", "serve", "--store", str(store), "--port", str(port)],
        cwd=REPO_ROOT,
        env={**os.environ, fleet_credential.ENV: STORE_TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        import urllib.request

        req = urllib.request.Request(f"{url}/versions", headers=fleet_credential.headers(STORE_TOKEN))
        with urllib.request.urlopen(req, timeout=2):
            return True

    wait_until(up, 30, what="store server")
    return proc, url
