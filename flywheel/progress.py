"""Progress bars for long operations: live on a terminal, a line every few seconds in a log file."""
from __future__ import annotations

import sys


def bar(iterable=None, *, total=None, desc: str = "", unit: str = "it", enabled: bool = True):
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=tty,
                mininterval=0.2 if tty else 10.0)
