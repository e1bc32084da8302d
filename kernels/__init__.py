"""Numerics shared by serving and training (batch-invariant ops, MoE routing) and delta-coding hot loops,
each with a Triton kernel for GPU and a CPU path tested against one reference. (Grows with the kernels issue.)
"""
