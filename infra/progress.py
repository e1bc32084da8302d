"""Progress bars for long operations: live on a terminal, a line every few seconds in a log file."""

from __future__ import annotations

import sys

from tqdm import tqdm


class _Bar(tqdm):
    def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):
        # tqdm redraws on every postfix change by default, which floods a log file; let mininterval decide.
        super().set_postfix(ordered_dict, refresh=refresh, **kwargs)


def bar(iterable=None, *, total=None, desc: str = "", unit: str = "it", enabled: bool = True):
    tty = sys.stderr.isatty()
    return _Bar(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        disable=not enabled,
        dynamic_ncols=tty,
        mininterval=0.2 if tty else 10.0,
    )
