"""Process and port helpers for the servers Flywheel starts on loopback (broker, replicas, gateway)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable


def spawn(cmd: list[str], die_with_parent: bool = True, **kw) -> subprocess.Popen:
    """Start a server process in its own session (its process group holds its children). With
    die_with_parent it gets SIGTERM when the process that started it ends, however that ends (kill -9, a
    second Ctrl-C in pytest, an OOM kill): util-linux `setpriv --pdeathsig` arms it and execs the command
    (same pid; no Python code runs between fork and exec, which is unsafe in a threaded parent). That
    signal reaches the group leader only, so a guard (infra.group_guard, armed the same way) ends the
    rest of the group too. Linux ties the signal to the forking thread: call it from one that lives as
    long as the server should. A command that starts a server and returns (`flywheel replica start`)
    passes die_with_parent=False."""
    setpriv = shutil.which("setpriv")
    if not (die_with_parent and setpriv):
        return subprocess.Popen(cmd, start_new_session=True, **kw)
    proc = subprocess.Popen([setpriv, "--pdeathsig", "TERM", "--", *cmd], start_new_session=True, **kw)
    proc.guard = subprocess.Popen(  # type: ignore[attr-defined]  # rides on the Popen it guards (tests read it)
        [
            setpriv,
            "--pdeathsig",
            "TERM",
            "--",
            sys.executable,
            "-I",
            "-S",
            str(Path(__file__).with_name("group_guard.py")),
            str(proc.pid),
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc


def in_netns(netns: str | None, cmd: list[str]) -> list[str]:
    """cmd, run inside a network namespace (a test host) if one is named. `ip netns exec` execs it, so the
    pid is the command's own."""
    return ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)


def kill_group_now(pid: int, timeout: float = 30.0) -> None:
    """kill -9 a server and its process group (a crash, for fault drills), and wait until it is gone."""
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_until(lambda: not pid_alive(pid), timeout, what=f"pid {pid} gone")


def identity(pid: int) -> dict:
    """What tells this process apart from a later one that reuses its pid: boot id and start time (and the
    command line, for whoever reads the pid file)."""
    with open(f"/proc/{pid}/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"pid": pid, "boot_id": boot, "start_ticks": start, "cmdline": cmd[:500]}


def same_process(recorded: dict) -> bool:
    """True if the process a state file recorded is still the one running under that pid. A state file
    from before a reboot, or whose process died and whose pid was reused, must not make us kill a
    stranger. Records without an identity (older state files) are trusted by pid alone."""
    pid = recorded.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    if "start_ticks" not in recorded:
        return True
    try:
        now = identity(pid)
    except OSError:
        return False
    # Boot and start time identify a process; its command line is recorded for people (it changes at exec).
    return all(now[k] == recorded[k] for k in ("boot_id", "start_ticks"))


_GIVEN: dict[int, float] = {}  # port -> when free_port handed it out
_GIVEN_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1", hold_s: float = 300.0) -> int:
    """A port the kernel says is free now (bind to 0); the caller binds it soon after. Servers launched
    side by side bind theirs only once loaded, so a port handed out here is not handed out again by this
    process for `hold_s`, though the kernel would."""
    with _GIVEN_LOCK:
        now = time.monotonic()
        for port, at in list(_GIVEN.items()):
            if now - at > hold_s:
                del _GIVEN[port]
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN[port] = now
                return port


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound (not listening) to a free IPv4 port of `host`, held until the server that will listen on
    it has: a server that loads for a while before it binds (an SGLang replica, ~20 s) keeps its port from
    the kernel's port-0 picks and from plain binds meanwhile (free_port's memory is this process's only).
    The server binds with SO_REUSEADDR (uvicorn, SGLang's own check), which Linux grants beside a bound
    socket that also has it and is not listening, and grants the same to any other process binding with
    SO_REUSEADDR (Kafka's Java, uvicorn): the hold narrows that race, it cannot refuse it. Close the socket
    once the server listens."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))  # without SO_REUSEADDR: the kernel picks a port nobody holds
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server's own bind may share it
    except BaseException:
        s.close()
        raise
    with _GIVEN_LOCK:
        _GIVEN[s.getsockname()[1]] = time.monotonic()
    return s


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
    """stop_pid, then forget the state file that recorded this pid (if it still records this one). A
    state file whose process is not the one now running under that pid is forgotten without a kill."""
    state = read_state(state_file)
    if state and state.get("pid") == pid and not same_process(state):
        state_file.unlink(missing_ok=True)
        return True
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


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    interval: float = 0.25,
    what: str = "condition",
    alive: Callable[[], bool] | None = None,
) -> None:
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
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last_error!r})" if last_error else "")
            )
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
