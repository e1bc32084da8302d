"""Guard of one server's process group: `python -I -S group_guard.py PGID` (started by infra.procs.spawn).

The parent's death signal (setpriv --pdeathsig) reaches only the server's group leader. What the leader
leaves behind when it dies during start-up, or by a signal it does not clean up after, stays: SGLang's
detokenizer and multiprocessing's resource tracker (which ignores SIGTERM) were found still running after
an interrupted `make test`. This guard gets the same death signal and ends the whole group: SIGTERM, then
SIGKILL to whatever is left after the grace period. It exits on its own once the group is empty (a server
stopped the normal way). Standard library only, run by path: nothing of the repository is imported.
"""

import os
import signal
import sys
import time

GRACE_S = 10.0  # a broker flushing its logs, SGLang stopping its children
POLL_S = 0.5


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # members that are no longer ours to signal (cannot happen as root)
        return True
    return True


def end_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    pgid = int(sys.argv[1])

    def on_term(*_: object) -> None:
        end_group(pgid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the parent's to handle
    while group_alive(pgid):
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
