"""Numerics shared by serving and training, and the delta-coding hot loops.

    batch_invariant  ops whose per-row result does not depend on the batch (linear, RMSNorm, softmax,
                     log-softmax, attention, router top-k); the trainer's model switches to them
    delta            XOR against the base, byte planes and their inverse, changed-element count
    triton_ops       the Triton kernels of both (GPU; tested on CPU under TRITON_INTERPRET=1)
    reference        float64 / element-by-element references everything is checked against
    gpu_check        the Triton kernels' section of the prepared GPU check (online_rl.gpu_check.check):
                     correctness on the device + timings against ceilings measured there
Importing this package is cheap: Triton loads only when a CUDA tensor (or a test) asks for it.

- `batch_invariant`: Batch-invariant ops for the trainer's forward: a row's result never depends on how many other
  rows share its batch, or where it sits.
- `cpu_math`: exp, log, silu, (log-)softmax and RMS normalisation in float32 whose result for an element never
  depends on where it sits (numba, CPU): kernels.batch_invariant's transcendentals and row kernels.
- `cpu_ops`: Fused CPU loops (numba) for what numpy can only do as a chain of whole-array passes: the delta codec's
  scan of a tensor against its base, its inverse (rebuilding the new bits from a payload and the base), and what an
  in-place apply needs of a sparse chunk.
- `delta`: Delta-coding hot loops over weight bits (uint views of bf16/fp16/fp32): XOR against the base, byte-plane
  split and its inverse, changed-element count; weight_sync.codec calls these.
- `gpu_check`: The Triton kernels' section of the prepared GPU check (online_rl.gpu_check.check runs it, with the
  trainer's FSDP2 step, the delta codec's GPU path and the batch-invariant forward): correctness of every Triton
  kernel against the numpy / float64 references on the device, batch invariance on the device, and timings against
  the ceilings measured in the same run (device-to-device copy bandwidth; cuBLAS fp32 matmul without TF32).
- `jit_cache`: Where numba keeps the kernels' machine code: under $FLYWHEEL_HOME/numba, keyed by the content of every
  module here (a fresh clone loads what an earlier one compiled).
- `reference`: Float64 references every kernel is checked against (CPU path and Triton alike).
- `simd`: One SIMD step that numba's loops cannot express, for kernels.cpu_ops: where in 16 consecutive elements two
  arrays differ, written as packed positions (a stream compaction: LLVM's `experimental.vector.compress`).
- `triton_ops`: Triton kernels: the batch-invariant ops and the delta-coding loops.
"""
