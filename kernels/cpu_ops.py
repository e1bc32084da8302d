"""Fused CPU loops (numba) for what numpy can only do as a chain of whole-array passes: the delta codec's scan
of a tensor against its base, its inverse (rebuilding the new bits from a payload and the base), and what an
in-place apply needs of a sparse chunk. Each reads its input once, checks every position it writes, and
releases the GIL. Compiled on first use and cached by content under $FLYWHEEL_HOME (kernels.jit_cache); `warm()`
compiles them ahead, off any hot path. kernels.delta picks these when numba imports, numpy otherwise.

Single-threaded on purpose (no `parallel=True`/prange): the publisher codes a tensor's chunks on a thread pool
(weight_sync.publish, codec.encode_tensor) and the agent decodes them on one (weight_sync.agent.loop), so chunks
already run side by side on every core; numba's own threads inside each would oversubscribe the cores and add
a fork-join per 8 MB chunk. benchmarks.kernels therefore compares one thread against a one-thread np.copyto.

Layouts: a chunk of n elements as an unsigned view (uint8/16/32/64) of its bits; "planes" are its bytes
plane after plane, (itemsize * n,) uint8 with byte b of element i at b * n + i (kernels.delta.split_planes);
a sparse payload is k zero-based gaps between changed positions as 4 byte planes, then each one's XOR with the
base as itemsize byte planes ((4 + itemsize) * k,) uint8 (weight_sync.codec's sparse chunk, after its header).
Loops run over blocks of BLOCK elements, so that a block of the inputs is still in L1 when a second simple
loop reads it again: simple loops are what LLVM vectorises, and one loop doing everything is not. The one
step no loop vectorises, appending the positions that changed, is an LLVM compress-store (kernels.simd).
Measured against a one-thread np.copyto of the same bytes on a 64 MB bf16 tensor, 10% changed, in 8 MB
chunks (benchmarks.kernels, benchmarks/results/kernels.json: the median of 5 runs and each run's scan ratio):
scan 0.6x, dense scatter 0.65x, sparse scatter 0.65x (0.85x at 2% changed, 0.45x at 30%); numpy's chain of
passes did 0.1-0.15x. Until issue #52 the scan did 0.06-0.16x on AMD Zen 4 CPUs (0.6x elsewhere): its
positions went out through a compress-store to memory, microcode there; kernels.simd says what changed, with
the figures. The scan on Zen 4 since: medians of 5 runs 0.44, 0.48, 0.55 and 0.54 in four
benchmark runs (single runs 0.34-1.09x), the machine loaded by two other engineers (load average 4 to 14).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kernels import jit_cache
from kernels.simd import LANES, store_changed_positions

jit_cache.install()  # before the first @njit: the machine code kept by content (kernels.jit_cache)

BLOCK = 4096  # elements: a block of new, base and its planes (4 B elements: 48 KB) stays in L1 between loops
BATCH = 1024  # sparse changes _sparse_patch joins at a time, into scratch that stays in L1


# ------------------------------------------------------------------------------------------ encoder's scan


@njit(cache=True, nogil=True)
def _split_block(new, base, planes, n, start):  # pragma: no cover - compiled
    # new, base: (m,) the block at element `start` of a chunk of n (base None: the raw bits, a full snapshot);
    # planes: (itemsize * n,) uint8. The weight path's widths (bf16/f16, f32 deltas) in one loop writing
    # every plane (measured 0.71x a memcpy against 0.61x for the loop per plane); the others one loop per
    # plane, re-reading the block from L1. Each vectorises.
    m = new.size
    at = lambda b: planes[b * n + start : b * n + start + m]  # noqa: E731  # plane b of this block
    if base is not None and new.itemsize == 2:
        p0, p1 = at(0), at(1)
        for i in range(m):
            x = new[i] ^ base[i]
            p0[i], p1[i] = np.uint8(x), np.uint8(x >> np.uint64(8))
    elif base is not None and new.itemsize == 4:
        p0, p1, p2, p3 = at(0), at(1), at(2), at(3)
        for i in range(m):
            x = new[i] ^ base[i]
            p0[i], p1[i] = np.uint8(x), np.uint8(x >> np.uint64(8))
            p2[i], p3[i] = np.uint8(x >> np.uint64(16)), np.uint8(x >> np.uint64(24))
    else:
        for b in range(new.itemsize):
            plane, shift = at(b), np.uint64(8 * b)
            if base is None:
                for i in range(m):
                    plane[i] = np.uint8(new[i] >> shift)
            else:
                for i in range(m):
                    plane[i] = np.uint8((new[i] ^ base[i]) >> shift)


@njit(cache=True, nogil=True)
def _count_block(new, base):  # pragma: no cover - compiled
    c = 0
    for i in range(new.size):  # branchless: a vectorised sum of compares
        c += new[i] != base[i]
    return c


@njit(cache=True, nogil=True)
def _positions_block(new, base, start, stop, idx, k):  # pragma: no cover - compiled
    # Appends the changed positions in [start, stop) to idx (uint32) from idx[k]; returns the new k.
    # idx must have room for stop - start positions past k (the caller sizes it).
    j = start
    while j + LANES <= stop:
        k += store_changed_positions(new, base, j, idx, k)
        j += LANES
    for i in range(j, stop):  # the tail: written at k every time, kept only when changed (no branch)
        idx[k] = i
        k += new[i] != base[i]
    return k


@njit(cache=True, nogil=True)
def _scan(new, base, planes, idx, cap):  # pragma: no cover - compiled
    # new, base: (n,) equal unsigned views; planes: (itemsize * n,) uint8 out; idx: (cap + BLOCK + LANES,) uint32
    # out. Writes the planes of new ^ base and, while at most cap changed, their positions; returns how many
    # changed. Past cap the positions stop (the codec then writes planes) and only the count goes on.
    n = new.size
    changed = 0
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        _split_block(new[start:stop], base[start:stop], planes, n, start)
        if changed <= cap:  # idx has room for a whole block past cap
            changed = _positions_block(new, base, start, stop, idx, changed)
        else:
            changed += _count_block(new[start:stop], base[start:stop])
    return changed


@njit(cache=True, nogil=True)
def _split(bits, planes):  # pragma: no cover - compiled
    n = bits.size
    for start in range(0, n, BLOCK):
        _split_block(bits[start : min(start + BLOCK, n)], None, planes, n, start)


POSITIONS_SLACK = BLOCK + LANES  # _scan records a block of positions past cap before it knows it passed it


def scan(new: np.ndarray, base: np.ndarray | None, cap: int, planes: np.ndarray, positions: np.ndarray) -> int:
    """See kernels.delta.scan: planes of (itemsize * n,) uint8, positions of at least cap + POSITIONS_SLACK
    uint32 (both C-contiguous); returns the changed count (n without a base)."""
    n = new.size
    if planes.size != new.nbytes or (base is not None and base.size != n) or not 0 <= cap <= n:
        raise ValueError(f"scan of {n} elements into {planes.size} plane bytes, cap {cap}")
    if base is not None and positions.size < cap + POSITIONS_SLACK:
        raise ValueError(f"{positions.size} positions for a cap of {cap} (+{POSITIONS_SLACK})")
    if base is None:
        _split(new, planes)
        return new.size
    return _scan(new, base, planes, positions, cap)


@njit(cache=True, nogil=True)
def _sparse_payload(positions, planes, n, itemsize, body):  # pragma: no cover - compiled
    # positions: (k,) uint32, sorted; planes: (itemsize * n,) uint8 of the XOR; body: the sparse payload out.
    k = positions.size
    for b in range(4):  # gaps, one plane at a time (vectorises); sorted positions: each gap >= 0
        plane, shift = body[b * k : (b + 1) * k], np.uint32(8 * b)
        if k:
            plane[0] = np.uint8(positions[0] >> shift)  # the gap from position -1
        for j in range(1, k):
            plane[j] = np.uint8((positions[j] - positions[j - 1] - np.uint32(1)) >> shift)
    for j in range(k):
        if positions[j] >= n:
            return -1
    for b in range(itemsize):  # the XOR of each changed element, gathered from its planes
        src, dst = planes[b * n : (b + 1) * n], body[(4 + b) * k : (5 + b) * k]
        for j in range(k):
            dst[j] = src[positions[j]]
    return k


def sparse_payload(positions: np.ndarray, planes: np.ndarray, n: int, itemsize: int, body: np.ndarray) -> None:
    """See kernels.delta.sparse_payload."""
    if body.size != (4 + itemsize) * positions.size or planes.size != itemsize * n:
        raise ValueError(f"a sparse payload of {body.size} bytes for {positions.size} changes")
    if _sparse_payload(positions, planes, n, itemsize, body) < 0:
        raise ValueError(f"a position outside a chunk of {n}")


# ------------------------------------------------------------------------------------ decoder's scatter


@njit(cache=True, nogil=True)
def _join_block(dst, base, planes, n, start):  # pragma: no cover - compiled
    # dst, base: (m,) the block at element `start` of a chunk of n (base None: the raw bits); planes:
    # (itemsize * n,) uint8. dst = the joined planes ^ base. As in _split_block: one loop reading every plane
    # for the weight path's widths (measured 0.69x a memcpy against 0.41x for a loop per plane), else the low
    # plane with the base, then one loop per higher plane XORed into dst (in L1).
    m, t = dst.size, dst.dtype.type
    at = lambda b: planes[b * n + start : b * n + start + m]  # noqa: E731  # plane b of this block
    if base is not None and dst.itemsize == 2:
        p0, p1 = at(0), at(1)
        for i in range(m):
            dst[i] = base[i] ^ (t(p0[i]) | (t(p1[i]) << t(8)))
    elif base is not None and dst.itemsize == 4:
        p0, p1, p2, p3 = at(0), at(1), at(2), at(3)
        for i in range(m):
            dst[i] = base[i] ^ (t(p0[i]) | (t(p1[i]) << t(8)) | (t(p2[i]) << t(16)) | (t(p3[i]) << t(24)))
    else:
        low = at(0)
        if base is None:
            for i in range(m):
                dst[i] = t(low[i])
        else:
            for i in range(m):
                dst[i] = base[i] ^ t(low[i])
        for b in range(1, dst.itemsize):
            plane, shift = at(b), t(8 * b)
            for i in range(m):
                dst[i] ^= t(plane[i]) << shift


@njit(cache=True, nogil=True)
def _join_xor(planes, base, out):  # pragma: no cover - compiled
    # out: (n,) the elements whose byte planes are `planes`, XOR base (None: as they are).
    n = out.size
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        _join_block(out[start:stop], None if base is None else base[start:stop], planes, n, start)


def join_xor(planes: np.ndarray, base: np.ndarray | None, out: np.ndarray) -> None:
    """See kernels.delta.join_xor."""
    if planes.size != out.nbytes or (base is not None and base.size != out.size):
        raise ValueError(f"join_xor of {planes.size} plane bytes into {out.size} elements")
    _join_xor(planes, base, out)


@njit(cache=True, nogil=True)
def _join_xors(body, k, j0, xs):  # pragma: no cover - compiled
    # Joins the XORs of changes j0 .. j0 + m of a sparse payload into xs (m,) of out's dtype: one loop reading
    # every plane for the weight path's widths, else plane after plane OR-ed in.
    m = xs.size
    t = xs.dtype.type
    at = lambda b: body[b * k + j0 : b * k + j0 + m]  # noqa: E731  # plane b of this batch
    if xs.itemsize == 2:
        x0, x1 = at(4), at(5)
        for i in range(m):
            xs[i] = t(x0[i]) | (t(x1[i]) << t(8))
    elif xs.itemsize == 4:
        x0, x1, x2, x3 = at(4), at(5), at(6), at(7)
        for i in range(m):
            xs[i] = t(x0[i]) | (t(x1[i]) << t(8)) | (t(x2[i]) << t(16)) | (t(x3[i]) << t(24))
    else:
        low = at(4)
        for i in range(m):
            xs[i] = t(low[i])
        for b in range(1, xs.itemsize):
            plane, shift = at(4 + b), t(8 * b)
            for i in range(m):
                xs[i] |= t(plane[i]) << shift


@njit(cache=True, nogil=True)
def _sparse_batch(body, k, j0, gaps, xs):  # pragma: no cover - compiled
    # Joins changes j0 .. j0 + m of a sparse payload into gaps (m,) uint32 and xs (m,) of out's dtype. One loop
    # reading every plane it joins (4x faster than OR-ing plane after plane into the output, measured).
    m = gaps.size
    u = np.uint32
    at = lambda b: body[b * k + j0 : b * k + j0 + m]  # noqa: E731  # plane b of this batch
    g0, g1, g2, g3 = at(0), at(1), at(2), at(3)
    for i in range(m):
        gaps[i] = u(g0[i]) | (u(g1[i]) << u(8)) | (u(g2[i]) << u(16)) | (u(g3[i]) << u(24))
    _join_xors(body, k, j0, xs)


@njit(cache=True, nogil=True)
def _copy(dst, src):  # pragma: no cover - compiled
    for i in range(dst.size):  # a plain loop: numba's slice assignment was 15% slower (measured)
        dst[i] = src[i]


@njit(cache=True, nogil=True)
def _sparse_patch(body, k, base, out):  # pragma: no cover - compiled
    # out: (n,) = base with the k changes of a sparse payload XORed in; base None: out holds the base already
    # (in place). Batch by batch: join the changes, sum the gaps into positions, copy the base up to the
    # batch's last one, patch them while that span is still in cache. Returns k, or -1 for a position past
    # the end (out is then partly written).
    n = out.size
    m = min(k, BATCH)
    gaps, xs, where = np.empty(m, np.uint32), np.empty(m, out.dtype), np.empty(m, np.uint64)
    copied, pos = np.int64(0), np.int64(-1)
    for j0 in range(0, k, BATCH):
        m = min(BATCH, k - j0)
        _sparse_batch(body, k, j0, gaps[:m], xs[:m])
        for i in range(m):
            pos += np.int64(gaps[i]) + 1
            where[i] = pos  # unsigned: indexing needs no negative-index fix-up
        if pos >= n:  # positions only grow: the batch's last is its largest
            return -1
        if base is not None:
            _copy(out[copied : pos + 1], base[copied : pos + 1])
            copied = pos + 1
        for i in range(m):
            out[where[i]] ^= xs[i]
    if base is not None:
        _copy(out[copied:], base[copied:])
    return k


def sparse_patch(body: np.ndarray, k: int, base: np.ndarray | None, out: np.ndarray) -> None:
    """See kernels.delta.sparse_patch."""
    if body.size != (4 + out.itemsize) * k or (base is not None and base.size != out.size):
        raise ValueError(f"a sparse payload of {body.size} bytes for {k} changes")
    if _sparse_patch(body, k, base, out) < 0:
        raise ValueError("sparse chunk points past its end")


# ------------------------------------------------------------------------------- in-place apply's loops


@njit(cache=True, nogil=True)
def _sparse_xor(body, k, n, offset, idx_out, xor_out):  # pragma: no cover - compiled
    # body: a sparse payload (see the module's docstring) of a chunk of n elements. A batch at a time: its XORs
    # joined by _sparse_batch's loops (they vectorise), then its gaps joined and summed into positions in
    # one loop (half the time of joining element by element, byte by byte: 1.6 against 3.1 ns a change).
    u = np.uint32
    pos = np.int64(-1)
    for j0 in range(0, k, BATCH):
        m = min(BATCH, k - j0)
        _join_xors(body, k, j0, xor_out[j0 : j0 + m])
        g0, g1 = body[j0 : j0 + m], body[k + j0 : k + j0 + m]
        g2, g3 = body[2 * k + j0 : 2 * k + j0 + m], body[3 * k + j0 : 3 * k + j0 + m]
        out = idx_out[j0 : j0 + m]
        for i in range(m):
            pos += np.int64(u(g0[i]) | (u(g1[i]) << u(8)) | (u(g2[i]) << u(16)) | (u(g3[i]) << u(24))) + 1
            out[i] = pos + offset
        if pos >= n:  # positions only grow: the batch's last is its largest
            return -1
    return k


def sparse_xor(body: np.ndarray, k: int, n: int, offset: int, idx_out: np.ndarray, xor_out: np.ndarray) -> None:
    """See kernels.delta.sparse_xor."""
    if _sparse_xor(body, k, n, offset, idx_out, xor_out) < 0:
        raise ValueError("sparse chunk points past its end")


@njit(cache=True, nogil=True)
def _xor_scatter(target, idx, x, shift):  # pragma: no cover - compiled
    n = target.size
    for j in range(idx.size):
        i = idx[j]
        if i < 0 or i >= n:
            return j
        target[i] ^= np.uint64(x[j]) << np.uint64(shift)  # stored back at the target's width
    return -1


def xor_scatter(target: np.ndarray, idx: np.ndarray, x: np.ndarray, shift: int = 0) -> None:
    """See kernels.delta.xor_scatter."""
    if (j := _xor_scatter(target, idx, x, shift)) >= 0:
        raise ValueError(f"position {idx[j]} is outside a tensor of {target.size} ({j} written before it)")


# ------------------------------------------------------------------------------------------------- warm


def _readonly(a: np.ndarray) -> np.ndarray:  # numba types read-only arrays apart (bytes, mapped files)
    a = a.copy()
    a.flags.writeable = False
    return a


def _both(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return a, _readonly(a)


def warm() -> None:
    """Compile (or load from the cache) the specialisations the weight path uses: bits as unsigned integers
    of 2 or 4 bytes, writable or read-only (a mapped checkpoint, a decompressed frame); positions as int32 or
    int64; 2-byte XORs into 4-byte bits (bf16 into a float32 replica)."""
    for view in (np.uint16, np.uint32):
        one = np.zeros(1, view)
        planes, positions = np.zeros(one.itemsize, np.uint8), np.zeros(1 + POSITIONS_SLACK, np.uint32)
        for new in _both(one):
            for base in (None, *_both(one)):
                scan(new, base, 1, planes, positions)
        sparse_payload(positions[:1], planes, 1, one.itemsize, np.zeros(4 + one.itemsize, np.uint8))
        for body in _both(np.zeros(one.itemsize, np.uint8)):
            for base in (None, *_both(one)):
                join_xor(body, base, np.zeros(1, view))
        for body in _both(np.zeros(4 + one.itemsize, np.uint8)):
            for base in (None, *_both(one)):
                sparse_patch(body, 1, base, np.zeros(1, view))
    for idx_dtype in (np.int32, np.int64):
        for idx in _both(np.zeros(1, idx_dtype)):
            for view in (np.uint16, np.uint32):
                x = np.zeros(1, view)
                for body in _both(np.zeros(4 + x.itemsize, np.uint8)):
                    sparse_xor(body, 1, 1, 0, np.zeros(1, idx_dtype), x)
                for xs in _both(x):
                    xor_scatter(np.zeros(1, view), idx, xs)
            for xs in _both(np.zeros(1, np.uint16)):
                xor_scatter(np.zeros(1, np.uint32), idx, xs, 16)
