"""Stub of vllm for SGLang on CPU (serving.replica.cpu_compat): only `_custom_ops` exists, and it is never called."""
