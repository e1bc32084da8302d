"""Stub of vllm for SGLang on CPU (serving.cpu_compat): only `_custom_ops` exists, and it is never called."""
