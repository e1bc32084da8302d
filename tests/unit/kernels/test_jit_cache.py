"""numba's cache of the kernels, kept by content (kernels.jit_cache): a fresh copy of the source (new mtimes, as a
fresh clone has) loads what an earlier copy compiled, and an edit of any kernels module compiles afresh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from infra.paths import REPO_ROOT

PROBE = """
import json, numpy as np
from kernels import cpu_math, jit_cache
x = np.linspace(-3, 3, 64, dtype=np.float32)
cpu_math._exp(x, np.empty_like(x))
s = cpu_math._exp.stats
print(json.dumps({"dir": str(jit_cache.cache_dir()), "path": s.cache_path, "file": cpu_math.__file__,
                  "hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values())}))
"""


def _copy(tmp, name):
    """The repository's kernels package alone, copied (new mtimes), importable as `kernels`."""
    root = tmp / name
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(root, home):
    env = {**os.environ, "PYTHONPATH": str(root), "FLYWHEEL_HOME": str(home)}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_copy_loads_what_an_earlier_copy_compiled_and_an_edit_compiles_afresh(tmp_path):
    home = tmp_path / "home"
    first = _run(_copy(tmp_path, "clone-a"), home)
    assert first["file"].startswith(str(tmp_path / "clone-a")), first
    assert first["misses"] == 1 and first["hits"] == 0, first  # compiled, and kept
    assert first["path"] == first["dir"] and first["dir"].startswith(str(home / "numba")), first
    time.sleep(1.1)  # another second: numba's own stamp (mtime, size) would differ for a copy made now
    again = _run(_copy(tmp_path, "clone-b"), home)
    assert again["hits"] == 1 and again["misses"] == 0 and again["dir"] == first["dir"], again
    edited = _copy(tmp_path, "clone-c")
    simd = edited / "kernels" / "simd.py"  # not cpu_math's own file: any module of kernels/ counts
    simd.write_text(simd.read_text() + "\n# an edit\n")
    changed = _run(edited, home)
    assert changed["misses"] == 1 and changed["dir"] != first["dir"], changed
