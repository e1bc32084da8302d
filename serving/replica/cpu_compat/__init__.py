"""The small layer that lets SGLang 0.5.23 serve on a CPU-only machine. Never used on a GPU.

Two measured gaps (shared/notes/facts.md), both on paths SGLang's CPU mode reaches but never runs:
1. `sglang/srt/layers/rotary_embedding/base.py` imports `vllm._custom_ops.rotary_embedding` when the
   device is not CUDA; we provide a stub module on the path (the function is never called on the
   torch-native path, and raises if it ever is).
2. `--enable-return-routed-experts` allocates its host buffer with cudaHostRegister (the default entry
   of `ALLOC_MEMORY_FUNCS`); on CPU we register a plain allocation for the "cpu" device instead.

And one start-up cost: SGLang starts its scheduler and detokenizer with multiprocessing "spawn" (which
CUDA needs), so each re-imports SGLang and torch, ~12 s of CPU apiece. With no CUDA they are forked
from the launcher instead, when it runs no other thread, and inherit its imports: a replica of the test
model ready in 19 s instead of 30 s on an idle machine, 18 s of CPU instead of 40 s, its answers,
logprobs, routed experts and /metrics names the same (measured, 2026-12-03).

- `launch`: `python -m serving.replica.cpu_compat.launch <sglang.launch_server args>`: SGLang with the CPU layer
  applied.
"""

from __future__ import annotations

from pathlib import Path

STUBS = Path(__file__).resolve().parent / "stubs"


def plain_alloc(dims, dtype, device, pin_memory, allocator=None, registration_granularity_bytes=None):
    """Same signature as SGLang's allocators; ordinary pageable memory (there is no GPU to pin for)."""
    import torch

    return torch.zeros(dims, dtype=dtype, device=device)


def apply() -> None:
    """Patch the running process. Refuses to run where CUDA is available."""
    import sys

    import torch

    if torch.cuda.is_available():
        raise RuntimeError("serving.replica.cpu_compat is for CPU-only machines; a GPU is visible here")
    if str(STUBS) not in sys.path:
        sys.path.append(str(STUBS))  # after site-packages: a real vllm, if installed, wins
    from sglang.srt.mem_cache.pool_host import common

    common.ALLOC_MEMORY_FUNCS["cpu"] = plain_alloc


def fork_children() -> None:
    """Start SGLang's children with "fork" (see above). For the launcher's main process, after apply().

    Spawn stays where a fork would be unsafe: another thread running (torch's OpenMP workers, there after
    `import torch` unless OMP_NUM_THREADS=1: a child forked then hangs in its first parallel region,
    measured), or prometheus_client already imported (it picks its multiprocess mode at import, before
    SGLang has set PROMETHEUS_MULTIPROC_DIR, and a forked child's metrics would not reach /metrics)."""
    import multiprocessing
    import os
    import sys

    from sglang.srt.entrypoints import engine

    set_envs_and_config = engine._set_envs_and_config  # where SGLang sets "spawn", just before its launches

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    def then_fork(server_args):
        set_envs_and_config(server_args)
        if threads() > 1:
            print(f"cpu_compat: SGLang's children spawned ({threads()} threads run here)", file=sys.stderr)
        elif "prometheus_client" in sys.modules:
            print("cpu_compat: SGLang's children spawned (prometheus_client imported early)", file=sys.stderr)
        else:
            multiprocessing.set_start_method("fork", force=True)

    def check_fork() -> None:  # one started after the check: say so in the replica's log
        if threads() > 1:
            print(f"cpu_compat: forking with {threads()} threads running", file=sys.stderr, flush=True)

    engine._set_envs_and_config = then_fork
    os.register_at_fork(before=check_fork)
