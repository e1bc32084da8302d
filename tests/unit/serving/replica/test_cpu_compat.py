"""The CPU compatibility layer: small, in one place, and it really patches SGLang in a fresh process."""

import subprocess
import sys

from infra.paths import REPO_ROOT


def test_apply_patches_sglang_allocator_and_provides_vllm_stub_and_forks_children(test_model):
    """One fresh process (SGLang's import is most of the cost). The start method: SGLang's own set-up asks
    for "spawn" just before it starts its children; with the layer it is "fork" after that call, unless
    prometheus_client was imported before (its multiprocess mode is picked at import) or another thread
    runs then (a fork copies one thread: torch's OpenMP workers, say, and a forked child hangs in its
    first parallel region, measured); a fork with threads running is logged. A live replica's children,
    forked and spawned: tests/integration/infra/test_no_orphans.py."""
    code = (
        "from serving.replica import cpu_compat; cpu_compat.apply()\n"
        "from sglang.srt.mem_cache.pool_host.common import ALLOC_MEMORY_FUNCS\n"
        "import torch\n"
        "assert ALLOC_MEMORY_FUNCS['cpu'] is cpu_compat.plain_alloc\n"
        "assert ALLOC_MEMORY_FUNCS['cuda'] is not cpu_compat.plain_alloc\n"
        "buf = ALLOC_MEMORY_FUNCS['cpu']((4, 2, 2), dtype=torch.int32, device='cpu', pin_memory=True)\n"
        "assert buf.shape == (4, 2, 2) and not buf.is_pinned() and int(buf.sum()) == 0\n"
        "from vllm._custom_ops import rotary_embedding\n"
        "try:\n    rotary_embedding()\nexcept NotImplementedError:\n    print('stub ok')\n"
        "import multiprocessing, threading\n"
        "cpu_compat.fork_children()\n"
        "from sglang.srt.entrypoints import engine\n"
        "from sglang.srt.server_args import ServerArgs\n"
        f"args = ServerArgs(model_path={str(test_model)!r}, device='cpu'); args.resolve_once()\n"
        "engine._set_envs_and_config(args)\n"
        "print('alone:', multiprocessing.get_start_method())\n"
        "import prometheus_client\n"
        "engine._set_envs_and_config(args)\n"
        "print('metrics imported early:', multiprocessing.get_start_method())\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "engine._set_envs_and_config(args)\n"
        "print('with a thread:', multiprocessing.get_start_method())\n"
        "import os\n"
        "pid = os.fork()\n"  # a fork with that thread running anyway: said in the log
        "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        # One OpenMP thread, as a replica given its threads runs (serving.replica.process: OMP_NUM_THREADS).
        env={"PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stub ok" in out.stdout
    assert "alone: fork" in out.stdout, out.stdout
    assert "metrics imported early: spawn" in out.stdout and "with a thread: spawn" in out.stdout, out.stdout
    assert "children spawned (prometheus_client imported early)" in out.stderr, out.stderr[-2000:]
    assert "children spawned (2 threads run here)" in out.stderr, out.stderr[-2000:]
    assert "forking with 2 threads running" in out.stderr, out.stderr[-2000:]


def test_layer_is_one_small_directory():
    files = [p for p in (REPO_ROOT / "serving" / "cpu_compat").rglob("*.py")]
    assert sum(len(p.read_text().splitlines()) for p in files) < 120
    # Nothing outside the layer touches SGLang's allocators or imports the stub.
    for p in REPO_ROOT.rglob("*.py"):
        if "cpu_compat" in p.parts or "tests" in p.parts:
            continue
        text = p.read_text()
        assert "ALLOC_MEMORY_FUNCS" not in text and "vllm" not in text, p
