"""Process and port helpers for the servers Flywheel starts on loopback (broker, replicas, gateway)."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (bind to 0); the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def stop_pid(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM the process group led by pid (or the pid alone), SIGKILL after timeout.

    Returns True when the process is gone. Servers are started with start_new_session=True, so the
    group holds their children too (SGLang's scheduler and detokenizer processes).
    """
    if not pid_alive(pid):
        return True
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return True
    target = (lambda sig: os.killpg(pgid, sig)) if pgid == pid else (lambda sig: os.kill(pid, sig))
    try:
        target(signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    else:
        try:
            target(signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Children left in the group (e.g. a scheduler that ignored SIGTERM) go too.
    if pgid == pid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(50):
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def stop_recorded(pid: int, state_file: Path, timeout: float = 30.0) -> bool:
    """stop_pid, then forget the state file that recorded this pid (if it still records this one)."""
    ok = stop_pid(pid, timeout=timeout)
    state = read_state(state_file)
    if ok and state and state.get("pid") == pid:
        state_file.unlink(missing_ok=True)
    return ok


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.25,
               what: str = "condition", alive: Callable[[], bool] | None = None) -> None:
    """Poll check() until true; raise TimeoutError after timeout, RuntimeError if alive() turns false."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            if check():
                return
        except Exception as e:  # not up yet; the last error is reported on timeout
            last_error = e
        if alive is not None and not alive():
            raise RuntimeError(f"process died while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)


def write_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
