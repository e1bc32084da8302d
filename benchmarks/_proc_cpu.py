"""CPU seconds spent by each process of a benchmark, read from the kernel's counters before and after a round.

On a machine whose cores every process shares (replica, gateway, shipper, broker, load generator), throughput
falls by whatever CPU a feature costs anywhere, so a gateway's logging is judged by CPU per request in every
process, not by its own event loop alone; and CPU time does not move with how busy the rest of the machine is,
which throughput does. Clock ticks (10 ms): a round of a few seconds at a few hundred requests/s resolves
~0.01 ms per request.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil

# What one part is: (pid, which) -> CPU seconds so far. `which`: "proc" (the process alone), "tree" (the
# process and its descendants),
# "main" (its main thread only), "threads" (its other threads), "mp_children" (its multiprocessing children,
# not the resource tracker: the event shipper).
Part = tuple[int, str]


def _times(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _tree(pid: int) -> float:
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            total += _times(p)
        except psutil.Error:  # exited between the listing and the read
            pass
    return total


def _threads(pid: int, main: bool) -> float:
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return 0.0
    return sum(t.user_time + t.system_time for t in threads if (t.id == pid) == main)


def _mp_children(pid: int) -> float:
    total = 0.0
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0.0
    for c in children:
        try:
            cmd = " ".join(c.cmdline())
            if "multiprocessing" in cmd and "resource_tracker" not in cmd:
                total += _times(c)
        except psutil.Error:
            pass
    return total


def _proc(pid: int) -> float:
    try:
        return _times(psutil.Process(pid))
    except psutil.Error:
        return 0.0


_READ: dict[str, Callable[[int], float]] = {
    "proc": _proc,
    "tree": _tree,
    "main": lambda pid: _threads(pid, True),
    "threads": lambda pid: _threads(pid, False),
    "mp_children": _mp_children,
}


def machine_busy_s() -> float:
    """CPU seconds every core spent on anything but idling (kernel threads and other tenants included)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def snapshot(parts: dict[str, Part]) -> dict[str, float]:
    out = {name: _READ[which](pid) for name, (pid, which) in parts.items()}
    out["machine"] = machine_busy_s()
    return out
