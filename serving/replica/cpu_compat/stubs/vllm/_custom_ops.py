"""Imported by SGLang's rotary embedding on non-CUDA devices; the torch-native path never calls it."""


def rotary_embedding(*args, **kwargs):
    raise NotImplementedError(
        "vllm._custom_ops.rotary_embedding is a stub (serving.replica.cpu_compat): "
        "this SGLang code path is not supported on CPU"
    )
