"""One SIMD step that numba's loops cannot express, for kernels.cpu_ops: where in 16 consecutive elements two
arrays differ, written as packed positions (a stream compaction, LLVM's `masked.compressstore`).

Why an intrinsic: a plain loop that records a position only when it changed is a chain of dependent adds (one
element per cycle at best) and LLVM never vectorises it; this step is one vector compare, one vpcompressd and a
popcount for 16 elements on a CPU with AVX-512 (measured 0.07 ns an element against 0.28 for the branchless
scalar loop and 0.23 for a lookup table). On a CPU without it LLVM expands the same call into a short sequence
per lane (measured, compiled for AVX2: 0.18-0.40 ns an element by share changed), still bit-exact.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16


def _contiguous_uint(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and isinstance(t.dtype, types.Integer)


@intrinsic
def store_changed_positions(typingctx, new, base, j, idx, k):
    """Inside njit: the positions i in [j, j + LANES) where new[i] != base[i], in order, as uint32 into
    idx[k:], and how many there are. new, base: equal unsigned dtypes, 1-D C-contiguous; idx: uint32 likewise.
    The caller keeps j + LANES <= new.size and k + LANES <= idx.size (nothing is checked here)."""
    if not (_contiguous_uint(new) and _contiguous_uint(base) and _contiguous_uint(idx)):
        return None
    if new.dtype != base.dtype or new.dtype.signed or idx.dtype != types.uint32:
        return None
    width = new.dtype.bitwidth

    def codegen(context, builder, sig, args):
        new_a, base_a, j_v, idx_a, k_v = (
            context.make_array(t)(context, builder, a) if isinstance(t, types.Array) else a
            for t, a in zip(sig.args, args)
        )
        i32, mask_int = ir.IntType(32), ir.IntType(LANES)
        elems, positions = ir.VectorType(ir.IntType(width), LANES), ir.VectorType(i32, LANES)
        mask_type = ir.VectorType(ir.IntType(1), LANES)

        def lanes_of(arr):  # unaligned loads: a mapped file's tensors need not be aligned
            return builder.load(builder.bitcast(builder.gep(arr.data, [j_v]), elems.as_pointer()), align=1)

        changed = builder.icmp_unsigned("!=", lanes_of(new_a), lanes_of(base_a))
        first = builder.insert_element(
            ir.Constant(positions, ir.Undefined), builder.trunc(j_v, i32), ir.Constant(i32, 0)
        )
        first = builder.shuffle_vector(first, ir.Constant(positions, ir.Undefined), ir.Constant(positions, [0] * LANES))
        compress = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [positions, i32.as_pointer(), mask_type]),
            f"llvm.masked.compressstore.v{LANES}i32",
        )
        dst = builder.gep(idx_a.data, [k_v])
        builder.call(compress, [builder.add(first, ir.Constant(positions, list(range(LANES)))), dst, changed])
        ctpop = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(mask_int, [mask_int]), f"llvm.ctpop.i{LANES}"
        )
        return builder.zext(builder.call(ctpop, [builder.bitcast(changed, mask_int)]), ir.IntType(64))

    return types.intp(new, base, j, idx, k), codegen
