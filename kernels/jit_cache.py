"""Where numba keeps the kernels' machine code (`@njit(cache=True)` in kernels.cpu_ops and kernels.cpu_math): under
$FLYWHEEL_HOME/numba, beside the virtualenv, in a folder named for the content of every module of kernels/.

Why not numba's default (next to the source, stamped by the file's mtime and size): a fresh clone has new mtimes,
so every clone compiled every kernel again, and CI clones afresh for each run: the delta kernels' unit tests took
40 s on a fresh clone and 3 s once compiled (2 cores), and each process of the suite that used a kernel first
paid its share. Keyed by content, a clone loads what an earlier clone of the same source compiled. And since the
key covers every module here, an edit of kernels.simd (whose intrinsic cpu_ops' kernels inline) recompiles them,
which numba's stamp of cpu_ops.py alone missed. numba keys each entry by the CPU it was compiled for and by its own
version besides, so a cache shared by machines of another kind, or kept across a numba upgrade, is not misused.

install() puts this locator first in numba's list (CacheImpl._locator_classes, numba's own extension point, also
reachable through NUMBA_CACHE_LOCATOR_CLASSES); a kernel module calls it before its first @njit. Where the folder
cannot be written, numba's own locators take over (next to the source).
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from numba.core import caching

KERNELS = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def sources_digest() -> str:
    """sha256 of every module of kernels/ (names and bytes), read once per process."""
    h = hashlib.sha256()
    for f in sorted(KERNELS.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """$FLYWHEEL_HOME/numba/<digest of kernels/>: one folder per content of the kernels."""
    home = os.environ.get("FLYWHEEL_HOME") or Path.home() / ".cache" / "flywheel"
    return Path(home) / "numba" / sources_digest()[:16]


class KernelsLocator(caching._CacheLocator):
    """numba's cache of a function defined in kernels/: in cache_dir(), stamped by the kernels' content."""

    def __init__(self, py_func, py_file: str):
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(cache_dir())

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        return sources_digest()

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file: str):
        if Path(py_file).resolve().parent != KERNELS:
            return None  # not ours: numba's own locators decide
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def install() -> None:
    """Make numba look for (and keep) the kernels' machine code in cache_dir(); idempotent."""
    locators = caching.CacheImpl._locator_classes
    if KernelsLocator not in locators:
        locators.insert(0, KernelsLocator)
