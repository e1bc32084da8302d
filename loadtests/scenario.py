"""A scenario's timeline inside a locust run: actions at fractions of the run time, done with the same
`flywheel` commands an SRE types (in a subprocess, so the load generator's event loop never blocks).

Where the actions act comes from the environment (`flywheel loadtest` sets it for its local fleet; for a
deployed fleet, set it yourself):
    FLYWHEEL_GATEWAY_URL, FLYWHEEL_ADMIN_TOKEN         to see which version each replica serves
    FLYWHEEL_WEIGHTS_STORE, FLYWHEEL_SIGNING_KEY,
    FLYWHEEL_KAFKA_BOOTSTRAP, FLYWHEEL_STORE_URL         to publish and roll back versions
    FLYWHEEL_LOADTEST_VERSIONS                           checkpoint dirs to publish, comma-separated
    FLYWHEEL_LOADTEST_BAD_VERSION                        a checkpoint dir that must be rolled back
    FLYWHEEL_BROKER_STOP_CMD, FLYWHEEL_BROKER_START_CMD  how to take Kafka down and bring it back
An action that fails (a command's error, a fleet that never reaches a version) fails the run.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import gevent
from locust import events

from admin_api.client import AdminClient
from loadtests import ide_users
from loadtests.runner import SCENARIO_OVERRUN_S

errors = ide_users.errors  # judged with the requests by ide_users' quitting listener


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"this scenario needs {name} in the environment")
    return value


def flywheel(*args: str, timeout: float = 300) -> str:
    """Run a `flywheel` command; its stdout. gevent's subprocess waits without blocking the users."""
    # Niced: on a shared box the publisher stands in for the trainer's machine, not for serving work.
    proc = subprocess.run(
        [sys.executable, "-m", "flywheel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: os.nice(10),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"flywheel {' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def shell(cmd: str, timeout: float = 120) -> None:
    proc = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed: {proc.stderr.strip()[-500:]}")


def served() -> dict[str, int | None]:
    return AdminClient(env("FLYWHEEL_GATEWAY_URL"), env("FLYWHEEL_ADMIN_TOKEN")).weights()["replicas"]


def wait_fleet_on(version: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(served().values()) == {version}:
            ide_users.mark(f"fleet on v{version}", version=version)
            return
        gevent.sleep(0.5)
    raise RuntimeError(f"the fleet did not reach v{version} in {timeout_s:.0f}s (serves {served()})")


def publish(checkpoint: str) -> int:
    ide_users.mark("publish", checkpoint=checkpoint)
    out = flywheel(
        "weights",
        "publish",
        "--checkpoint",
        checkpoint,
        "--store",
        env("FLYWHEEL_WEIGHTS_STORE"),
        "--key",
        env("FLYWHEEL_SIGNING_KEY"),
        "--kafka",
        env("FLYWHEEL_KAFKA_BOOTSTRAP"),
        "--store-url",
        env("FLYWHEEL_STORE_URL"),
    )
    version = json.loads(out.strip().splitlines()[-1])["version"]
    ide_users.marks[-1]["version"] = version
    return version


def rollback(to: int) -> None:
    ide_users.mark(f"rollback to v{to}", version=to)
    flywheel(
        "weights",
        "rollback",
        "--to",
        str(to),
        "--reason",
        "loadtest rollback",
        "--store",
        env("FLYWHEEL_WEIGHTS_STORE"),
        "--key",
        env("FLYWHEEL_SIGNING_KEY"),
        "--kafka",
        env("FLYWHEEL_KAFKA_BOOTSTRAP"),
    )


def versions() -> list[str]:
    return [v for v in env("FLYWHEEL_LOADTEST_VERSIONS").split(",") if v]


def install(steps: list[tuple[float, object]]) -> None:
    """Run `steps` [(fraction of the run time, callable)] once the test starts; later steps may rely on
    state earlier ones return through the shared dict they are given. The run lasts its run time, and longer
    while an action is still going (up to SCENARIO_OVERRUN_S): locust's own limit would quit in the middle of
    one, and the run would pass with a version published but never reached (CI, a loaded box: the third switch
    still draining at the end). A run stopped before the scenario ended (a signal, the overrun) fails."""
    held: dict = {}
    progress = {"step": 0, "done": False}

    @events.init.add_listener
    def _hold_run_time(environment, **_kw) -> None:
        opts = environment.parsed_options
        if opts is not None and opts.run_time:  # taken before locust arms its timer on it (after init)
            held["run_time"], opts.run_time = float(opts.run_time), None

    @events.test_start.add_listener
    def _start(environment, **_kw) -> None:
        if "run_time" not in held:
            errors.append("scenarios need a run time (-t / --duration)")
            gevent.spawn(environment.runner.quit)
            return
        gevent.spawn(_timeline, environment, steps, held["run_time"], progress)
        gevent.spawn_later(held["run_time"] + SCENARIO_OVERRUN_S, _overdue, environment, progress, len(steps))

    # Fired in reverse order of registration: before ide_users' listener judges the run (the locustfile imports
    # ide_users first).
    @events.quitting.add_listener
    def _unfinished(environment, **_kw) -> None:
        if "run_time" in held and not progress["done"] and not errors:
            errors.append(f"the run stopped before its scenario ended (at step {progress['step'] + 1} of {len(steps)})")


def _overdue(environment, progress: dict, n: int) -> None:
    if not progress["done"]:
        step = f"step {progress['step'] + 1} of {n}"
        errors.append(f"the scenario was still acting {SCENARIO_OVERRUN_S:.0f}s past its run time ({step})")
        environment.runner.quit()


def _timeline(environment, steps, run_time: float, progress: dict) -> None:
    t0 = time.monotonic()
    state: dict = {}
    for i, (fraction, action) in enumerate(steps):
        progress["step"] = i
        gevent.sleep(max(0.0, t0 + fraction * run_time - time.monotonic()))
        try:
            action(state)
        except Exception as e:  # the run fails with it, now
            errors.append(f"{getattr(action, '__name__', action)}: {e}")
            ide_users.mark("action failed", error=str(e)[:300])
            break
    else:
        progress["step"] = len(steps)
        gevent.sleep(max(0.0, t0 + run_time - time.monotonic()))
    progress["done"] = True
    environment.runner.quit()
