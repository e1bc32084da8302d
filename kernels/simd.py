"""One SIMD step that numba's loops cannot express, for kernels.cpu_ops: where in 16 consecutive elements two
arrays differ, written as packed positions (a stream compaction: LLVM's `experimental.vector.compress` into a
register, then one 64-byte store).

Why an intrinsic: a plain loop that records a position only when it changed is a chain of dependent adds (one
element per cycle at best) and LLVM never vectorises it; this step is one vector compare, one vpcompressd and a
popcount for 16 elements on a CPU with AVX-512 (0.28 ns an element for the branchless scalar loop, 0.23 for a
lookup table, measured when this was written).

Why compress into a register and not LLVM's `masked.compressstore` (what this step used until issue #52): that
call becomes vpcompressd with a memory operand, which AMD Zen 4 (LLVM's znver4: the AMD EPYC machines this
project runs on) executes as microcode. Measured here (2 cores of a Zen 4 EPYC, shared; the loop over 4M bf16
elements, best of 7, by share changed 2% / 10% / 30%): compressstore 2.1 / 2.3 / 3.3 ns an element, compress
into a register and store 0.10 / 0.12 / 0.14 ns; compiled for AVX2 (NUMBA_CPU_NAME=haswell, where LLVM expands
both calls lane by lane) 2.1 / 2.3 / 2.1 against 0.10 / 0.08 / 0.15 ns. The encoder's scan (benchmarks.kernels,
64 MB, 10% changed, 5 runs side by side) went from 0.06-0.13x a one-thread memcpy (median 0.086; the issue's
fresh machines: 0.149x and 0.156x) to medians of 0.44, 0.48, 0.55 and 0.54 in four runs of the benchmark
(single runs 0.34-1.09x), the machine loaded by two other engineers throughout (load average 4 to 14). The
0.62x recorded before came from a CPU where a compress-store to memory is fast (this docstring said 0.07 ns an
element for it; the record did not name the CPU, so benchmarks.kernels now writes `cpu`).
Neither numba's cache nor threads were the cause: the benchmark warms the kernels before it times them (a
compile on a fresh clone, 2-4 s, or 0.5 s to load them from the cache, is outside the timing), numba keys
its cache by CPU (another CPU compiles afresh), and the loops are single-threaded (no prange: NUMBA_NUM_THREADS
does not apply; torch's threads are idle while they run).
The whole store writes idx[k : k + LANES] whatever the count: the caller's slack (cpu_ops.POSITIONS_SLACK)
already covers a full step. numba's own cache stamped cpu_ops' kernels by cpu_ops.py's timestamp alone, so an
edit of only this file kept the old machine code; kernels.jit_cache now keys it by the content of every module here.
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
    idx[k:], and how many there are (c: idx[k + c : k + LANES] is written too, with junk). new, base: equal
    unsigned dtypes, 1-D C-contiguous; idx: uint32 likewise. The caller keeps j + LANES <= new.size and
    k + LANES <= idx.size (nothing is checked here)."""
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
        # compressed in a register, then one whole-vector store: LLVM lowers a masked.compressstore to
        # vpcompressd with a memory operand, microcoded on AMD Zen 4 (see the module's docstring)
        compress = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(positions, [positions, mask_type, positions]),
            f"llvm.experimental.vector.compress.v{LANES}i32",
        )
        lane_positions = builder.add(first, ir.Constant(positions, list(range(LANES))))
        packed = builder.call(compress, [lane_positions, changed, ir.Constant(positions, ir.Undefined)])
        builder.store(packed, builder.bitcast(builder.gep(idx_a.data, [k_v]), positions.as_pointer()), align=1)
        ctpop = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(mask_int, [mask_int]), f"llvm.ctpop.i{LANES}"
        )
        return builder.zext(builder.call(ctpop, [builder.bitcast(changed, mask_int)]), ir.IntType(64))

    return types.intp(new, base, j, idx, k), codegen
