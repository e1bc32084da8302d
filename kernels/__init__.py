"""Numerics shared by serving and training, and the delta-coding hot loops.

    batch_invariant  ops whose per-row result does not depend on the batch (linear, RMSNorm, softmax,
                     log-softmax, attention, router top-k); the trainer's model switches to them
    delta            XOR against the base, byte planes and their inverse, changed-element count
    triton_ops       the Triton kernels of both (GPU; tested on CPU under TRITON_INTERPRET=1)
    reference        float64 / element-by-element references everything is checked against
    gpu_check        the Triton kernels' section of the prepared GPU check (online_rl.gpu_check.check):
                     correctness on the device + timings against ceilings measured there
Importing this package is cheap: Triton loads only when a CUDA tensor (or a test) asks for it.
"""
