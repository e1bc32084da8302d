"""Files that must survive a crash whole: written beside, fsynced, renamed into place, the directory fsynced.
Every package's small durable state goes through here (the trainer's checkpoint commit and provenance, the keys
file and its policies, the spool's list of forgotten tenants)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: the renames and creations in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, mode: int | None = None) -> None:
    """`data` at `path`, all of it or none of it, also across a crash; `mode` (e.g. 0o600) before it is visible.
    The temporary name carries the pid: two processes writing the same file never share one."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_path(path.parent)
