"""`python -m serving.replica.cpu_compat.launch <sglang.launch_server args>`: SGLang with the CPU layer applied.

apply() runs at module level: were SGLang's children spawned, each would re-import this module (as
__mp_main__) and be patched too; forked (fork_children), they inherit the patched modules.
"""

import runpy

from serving.replica import cpu_compat

cpu_compat.apply()

if __name__ == "__main__":
    cpu_compat.fork_children()
    runpy.run_module("sglang.launch_server", run_name="__main__")
