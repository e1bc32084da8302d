"""Starting a runner in a fresh jail and exchanging with it: its settings (SandboxConfig), the job on its stdin and
its capped answer on stdout until it ends or the wall clock does (then its whole PID namespace ends), and the outer
uid it runs as. The one-function judge (online_rl.sandbox.judge) and the test-suite jobs (online_rl.sandbox.suite)
both start their runners here.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from online_rl.sandbox.jail import Limits, SandboxUnavailable, bare_command, bwrap_command

STDERR_CAP = 64 << 10
UID_SPAN = 4096 * 64  # outer uids: 64 concurrent slots for each of 4096 process ids (pid mod 4096)


@dataclass
class SandboxConfig:
    cpu_seconds: int = 2
    memory_mb: int = 256  # address space
    wall_seconds: float = 4.0  # the whole run, start-up included; then the PID namespace is killed
    file_bytes: int = 1 << 20  # largest file it may write (in its tmpfs)
    open_files: int = 32
    processes: int = 16  # per sandbox (RLIMIT_NPROC of its own outer uid)
    tmpfs_mb: int = 16  # size of each of its tmpfs mounts (work dir, /tmp)
    result_bytes: int = 1 << 20  # the result channel's cap: past it the run is killed
    workers: int = 0  # candidates judged at once (0: one per core)
    outer_uid_base: int = 3_000_000  # as root: bwrap runs as an unprivileged uid of [base, base + UID_SPAN)

    def limits(self) -> Limits:
        return Limits(
            cpu_seconds=self.cpu_seconds,
            memory_mb=self.memory_mb,
            file_bytes=self.file_bytes,
            open_files=self.open_files,
            processes=self.processes,
            tmpfs_bytes=self.tmpfs_mb << 20,
        )


def _exchange(proc: subprocess.Popen, job: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Feed the job, read stdout up to `cap` and stderr up to STDERR_CAP until EOF, the cap or the deadline."""
    assert proc.stdin and proc.stdout and proc.stderr, "started with three pipes"
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    out, err, view, why = bytearray(), bytearray(), memoryview(job), None
    try:
        while any(k.fileobj is proc.stdout for k in sel.get_map().values()):
            left = deadline - time.monotonic()
            if left <= 0:
                why = "wall_time"
                break
            for key, _ in sel.select(left):
                f = key.fileobj
                assert not isinstance(f, int), "registered as file objects"
                if f is proc.stdin:
                    try:
                        view = view[os.write(f.fileno(), view[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: what it read is all it gets
                        view = view[:0]
                    if not view:
                        sel.unregister(f)
                        f.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    continue
                if f is proc.stdout:
                    out += chunk
                    if len(out) > cap:
                        why = "output_flood"
                        return bytes(out[:cap]), bytes(err), why
                elif len(err) < STDERR_CAP:
                    err += chunk[: STDERR_CAP - len(err)]
    finally:
        sel.close()
    return bytes(out), bytes(err), why


def _sandbox_pidfd(info: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's PID 1, from bwrap's --info-fd. Opened before the job is sent (PID 1 is
    then alive, waiting for it), so the pid cannot have been reused."""
    sel = selectors.DefaultSelector()
    sel.register(info, selectors.EVENT_READ)
    data = b""
    try:
        while time.monotonic() < deadline and sel.select(max(0.0, deadline - time.monotonic())):
            chunk = os.read(info, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        sel.close()
        os.close(info)
    try:
        return os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (ValueError, KeyError, TypeError, OSError):
        return None


def _end(proc: subprocess.Popen, pidfd: int | None) -> int:
    """Kill the sandbox's PID 1, which ends its PID namespace and every process in it, then reap bwrap
    (bwrap reaps PID 1, so nothing is left as a zombie)."""
    if proc.poll() is None:
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.killpg(proc.pid, signal.SIGKILL)  # --die-with-parent takes the sandbox along
        except OSError:
            pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None and not f.closed:
            f.close()
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    if pidfd is not None:
        os.close(pidfd)
    return code


def limits_for_runner(cfg: SandboxConfig) -> dict:
    """The limits a runner sets on itself inside the jail (the jail sets its own too)."""
    return {
        "cpu_seconds": cfg.cpu_seconds,
        "memory_mb": cfg.memory_mb,
        "file_bytes": cfg.file_bytes,
        "open_files": cfg.open_files,
        "processes": cfg.processes,
    }


def exchange(
    cfg: SandboxConfig, uid: int | None, payload: bytes, program: str | None = None, bare: bool = False
) -> tuple[bytes, int, str | None]:
    """Start a runner in a fresh jail (`program`: its source, else the one-function runner; `bare`: no jail, the
    sandbox benchmark's baseline) as `uid`, write `payload` on its stdin and read its capped stdout until it ends or
    the wall clock does; the whole PID namespace ends with it. (stdout, exit code, why it was stopped or None.)"""
    info_r: int | None = None
    info_w: int | None = None
    if bare:
        argv = bare_command()
    else:
        info_r, info_w = os.pipe()
        argv = bwrap_command(cfg.limits(), info_fd=info_w, program=program)
    kw: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            close_fds=True,
            pass_fds=() if info_w is None else (info_w,),
            start_new_session=True,
            cwd="/",
            **kw,
        )
    except OSError as e:
        if info_r is not None:
            os.close(info_r)
        raise SandboxUnavailable(f"cannot start {argv[0]} as uid {uid}: {e}") from e
    finally:
        if info_w is not None:
            os.close(info_w)
    pidfd = None
    try:
        if info_r is not None:
            pidfd = _sandbox_pidfd(info_r, start + cfg.wall_seconds)
        out, err, why = _exchange(proc, payload, start + cfg.wall_seconds, cfg.result_bytes)
    finally:
        code = _end(proc, pidfd)
    if err.startswith(b"bwrap:"):
        raise SandboxUnavailable(f"bwrap could not set up the sandbox: {err.decode(errors='replace').strip()}")
    return out, code, why


_slots_lock = threading.Lock()
_slots_busy: set[int] = set()


@contextlib.contextmanager
def outer_uid(cfg: SandboxConfig):
    """The uid bwrap runs as (when we are root): distinct for every sandbox running at once in this
    process, and apart from other processes' (by pid), so each has its own process limit."""
    if os.geteuid() != 0:
        yield None
        return
    with _slots_lock:
        slot = next(i for i in range(len(_slots_busy) + 1) if i not in _slots_busy)
        _slots_busy.add(slot)
    try:
        yield cfg.outer_uid_base + (os.getpid() % 4096) * 64 + slot % 64
    finally:
        with _slots_lock:
            _slots_busy.discard(slot)
