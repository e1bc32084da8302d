"""`python -m serving.cpu_compat.launch <sglang.launch_server args>`: SGLang with the CPU layer applied.

SGLang starts its scheduler and detokenizer with multiprocessing "spawn"; a spawned child re-imports
this module (as __mp_main__), so the module-level apply() patches every SGLang process, not just this one.
"""

import runpy

from serving import cpu_compat

cpu_compat.apply()

if __name__ == "__main__":
    runpy.run_module("sglang.launch_server", run_name="__main__")
