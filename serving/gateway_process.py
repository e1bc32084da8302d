"""Run the gateway as its own process (`flywheel serve`), as the demo and the tests do; stop it by PID."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from infra.paths import REPO_ROOT
from infra.procs import free_port, in_netns, spawn, stop_pid, tail, wait_until


@dataclass
class GatewayProcess:
    pid: int
    url: str
    log_file: Path

    def stop(self, timeout: float = 20.0) -> bool:
        return stop_pid(self.pid, timeout)


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):
            return True
    except urllib.error.HTTPError:  # 503 "degraded" still means the gateway is up
        return True


def start(
    replicas: list[str],
    model_dir: Path,
    state_dir: Path,
    kafka: str | None = None,
    keys: dict[str, str] | None = None,
    admin_token: str | None = None,
    port: int = 0,
    extra_args: Sequence[str] = (),
    timeout_s: float = 60.0,
    host: str = "127.0.0.1",
    netns: str | None = None,
    env: dict[str, str] | None = None,
) -> GatewayProcess:
    """A gateway listening on host:port, inside network namespace `netns` if given (a test host: give
    the port, it cannot be probed from here). `env` adds to its environment (FLYWHEEL_ID_SECRET shared by
    gateways behind one load balancer)."""
    if netns and not port:
        raise ValueError("a gateway in a network namespace needs its port")
    port = port or free_port(host)
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    child_env.pop("FLYWHEEL_KAFKA_BOOTSTRAP", None)
    if keys:
        child_env["FLYWHEEL_API_KEYS"] = ",".join(f"{name}:{key}" for name, key in keys.items())
    if admin_token:
        child_env["FLYWHEEL_ADMIN_TOKEN"] = admin_token
    child_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "flywheel",
        "serve",
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        *[a for r in replicas for a in ("--replica", r)],
        *extra_args,
    ]
    if kafka:
        cmd += ["--kafka", kafka]
    cmd = in_netns(netns, cmd)
    log_file = state_dir / "gateway.log"
    with open(log_file, "ab") as log:
        proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, cwd=REPO_ROOT)
    url = f"http://{host}:{port}"
    gw = GatewayProcess(pid=proc.pid, url=url, log_file=log_file)
    try:
        wait_until(
            lambda: _up(url), timeout_s, interval=0.2, what=f"gateway on {url}", alive=lambda: proc.poll() is None
        )
    except (TimeoutError, RuntimeError) as e:
        gw.stop()
        raise RuntimeError(f"{e}\n--- {log_file} ---\n{tail(log_file)}") from None
    return gw
