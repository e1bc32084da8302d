"""The isolation around one candidate: a bubblewrap (`bwrap`) command line, and the checks that it works.

Each candidate gets fresh user, PID, network, IPC, UTS and cgroup namespaces (`--unshare-all`), runs as
uid/gid 65534 inside, on a root that is an empty tmpfs remounted read-only, holding only the Python
interpreter, its standard library and the shared libraries those load (found with `ldd`), plus bwrap's
minimal /dev (null, zero, full, random, urandom, tty, a pts; read-only, /dev/shm included), a private
size-capped tmpfs work dir and /tmp. No /proc, no /etc, no cache, no repo,
no virtualenv, no keys. `--die-with-parent` and `--new-session`; when the command ends, or the harness
kills bwrap, the PID namespace ends and every process in it with it.

When the harness runs as root, bwrap itself runs as an unprivileged outer uid (one per concurrent slot,
so one candidate's fork bomb cannot eat another's process limit), creating its user namespace the way
an ordinary user would: outside the namespace the candidate's processes belong to that uid, not root.

The interpreter is a system one the unprivileged uid can read (`/usr/bin/python3.X`): a virtualenv or a
pyenv build under /root is neither readable by it nor wanted in there.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).with_name("runner.py")
WORK_DIR = "/sandbox"  # inside the sandbox: its private tmpfs work dir
SANDBOX_UID = 65534  # inside: nobody


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here: the sandbox refuses to run rather than run weaker."""


@functools.lru_cache(maxsize=1)
def runner_source() -> str:
    return RUNNER.read_text()


def _world_readable(path: Path) -> bool:
    """True if a uid with no special rights can reach and read `path` (every directory above searchable)."""
    try:
        path = Path(os.path.realpath(path))
        for d in list(path.parents)[:-1]:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def interpreter() -> tuple[str, str]:
    """(python, stdlib dir) of a system interpreter of this Python's minor version that others can read."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for exe in (
        getattr(sys, "_base_executable", sys.executable),
        f"/usr/bin/python{ver}",
        f"/usr/local/bin/python{ver}",
    ):
        exe = os.path.realpath(exe)
        if exe in tried:
            continue
        tried.append(exe)
        if not (_world_readable(Path(exe)) and os.stat(exe).st_mode & stat.S_IXOTH):
            continue
        try:
            out = subprocess.run(
                [exe, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
                capture_output=True,
                text=True,
                timeout=30,
                env={},
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        stdlib = out.stdout.strip()
        if out.returncode == 0 and _world_readable(Path(stdlib) / "os.py"):
            return exe, os.path.realpath(stdlib)
    raise SandboxUnavailable(
        f"no Python {ver} interpreter that an unprivileged uid can read (tried {', '.join(tried)}); "
        f"install Debian's python{ver} (scripts/setup.sh does)"
    )


def _path_ops(path: str, ops: dict[str, tuple[str, str, str]]) -> None:
    """Reproduce `path` in the sandbox: every symlink met on the way to it (e.g. /lib64 -> usr/lib64),
    then a read-only bind of the file it reaches."""
    cur, todo = "/", [p for p in path.split("/") if p]
    while todo:
        name = todo.pop(0)
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            ops.setdefault(nxt, ("--symlink", target, nxt))
            if target.startswith("/"):
                cur = "/"
            todo = [p for p in target.split("/") if p and p != "."] + todo
        else:
            cur = nxt
    ops.setdefault(cur, ("--ro-bind", cur, cur))


@functools.lru_cache(maxsize=1)
def root_ops() -> tuple[str, ...]:
    """The bwrap arguments that build the minimal read-only root: interpreter, stdlib, their libraries."""
    exe, stdlib = interpreter()
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailable("ldd not found (Debian package libc-bin): cannot list the interpreter's libraries")
    objects = [exe] + [str(p) for p in Path(stdlib, "lib-dynload").glob("*.so")]
    out = subprocess.run([ldd, *objects], capture_output=True, text=True, timeout=60, env={"LC_ALL": "C"}).stdout
    libs = sorted(set(re.findall(r"(?:=>\s*)?(/\S+)\s+\(0x", out)))
    ops: dict[str, tuple[str, str, str]] = {}
    for p in [exe, *libs]:
        _path_ops(p, ops)
    ops.setdefault(stdlib, ("--ro-bind", stdlib, stdlib))
    # Symlinks first (they may be parents of nothing we bind, but must exist before anything resolves them).
    ordered = sorted(ops.values(), key=lambda op: (op[0] != "--symlink", op[2]))
    return tuple(a for op in ordered for a in op)


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int
    memory_mb: int
    file_bytes: int
    open_files: int
    processes: int
    tmpfs_bytes: int


def bwrap_command(limits: Limits, info_fd: int, program: str | None = None) -> list[str]:
    """argv that runs the runner (or `program`, the source of another stdlib-only runner such as
    suite_runner's) on stdin's job inside a fresh sandbox."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` "
            "(scripts/setup.sh does this); the sandbox does not run without it"
        )
    exe, _ = interpreter()
    size = str(limits.tmpfs_bytes)
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--clearenv",
        "--cap-drop",
        "ALL",
        "--info-fd",
        str(info_fd),
        *root_ops(),
        # bwrap's /dev is a tmpfs of its own (with /dev/shm): read-only, or it is a way to fill RAM.
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--size",
        size,
        "--tmpfs",
        "/tmp",
        "--size",
        size,
        "--tmpfs",
        WORK_DIR,
        "--remount-ro",
        "/",
        "--chdir",
        WORK_DIR,
        exe,
        "-I",
        "-S",
        "-B",
        "-c",
        runner_source() if program is None else program,
    ]


def bare_command() -> list[str]:
    """The same runner in a bare subprocess, no isolation: only to measure what the isolation costs
    (benchmarks/sandbox.py). Nothing in the trainer can select it."""
    return [sys.executable, "-I", "-S", "-B", "-c", runner_source()]
