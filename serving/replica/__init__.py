"""SGLang replicas: launched (process, launch, with the CPU layer cpu_compat on a CPU-only machine) and spoken to
(engine, the client of one replica's native API).

- `engine`: Client for one SGLang replica's native /generate API (token ids in, tokens + logprobs + experts out).
- `launch`: `python -m serving.replica.launch <module> <args>`: run an SGLang launcher module with the replica's
  keys (contracts.replica_keys) added to its arguments inside this process.
- `process`: Launch, find and stop SGLang replicas (one `sglang.launch_server` process tree each).
- `cpu_compat/`: The small layer that lets SGLang 0.5.23 serve on a CPU-only machine.
"""
