"""Lossless per-tensor delta coding of weights: XOR with the base, then byte planes or a sparse form, then zstd.

Tensors are handled as their raw bit patterns (uint16 for bf16/f16, uint32 for f32), so the rebuilt
bytes are identical to the trainer's, NaN payloads, infinities, -0.0 and denormals included. A tensor is
cut into chunks of `chunk_elems` elements, each coded on its own (so large tensors stream and chunks
decode in parallel) in whichever of these is smaller for its share of changed elements:
  planes  the XOR (or the raw bits, for a full snapshot) split into byte planes: plane k holds byte k of
          every element, so the mostly-zero high bytes of a small update become long zero runs;
  sparse  the positions of the changed elements as gaps (uint32, plane-split) and their XOR values
          (plane-split): a few bytes per changed element, independent of the unchanged ones.
Each chunk is one zstd frame. A chunk is read once to code it (kernels.delta.scan: the planes, the changed
count and, when few changed, their positions, in one fused pass) and each element written once to decode it
(kernels.delta.join_xor, sparse_patch).
"""

from __future__ import annotations

import struct
import threading
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import xxhash
import zstandard

from kernels import delta as delta_kernels

# safetensors dtype name -> unsigned integer view of its bits
BIT_VIEWS = {
    "BF16": np.uint16,
    "F16": np.uint16,
    "F32": np.uint32,
    "F64": np.uint64,
    "I8": np.uint8,
    "U8": np.uint8,
    "I16": np.uint16,
    "I32": np.uint32,
    "I64": np.uint64,
}
# The smaller form by share of changed elements, measured on bf16 updates of 1-2 ULP (benchmarks.delta):
# sparse was 1.3x-1.8x smaller than planes from 2% to 30% changed; past ~35% positions cost more than
# the zero runs planes leave to zstd. Coding both and keeping the smaller would halve encode throughput.
SPARSE_MAX_SHARE = 0.35
DEFAULT_CHUNK_ELEMS = 4 << 20
DEFAULT_LEVEL = 1  # chosen by benchmarks.delta: higher levels cost throughput for a few % of size

_SPARSE_HEADER = struct.Struct("<I")  # number of changed elements


@dataclass
class ChunkMeta:
    offset: int  # first element
    elems: int
    encoding: str  # planes | sparse
    size: int  # compressed bytes
    digest: str  # xxh3-128 of the compressed bytes
    changed: int  # elements that differ from the base (all of them for a full snapshot)

    def to_json(self) -> dict:
        return {
            "offset": self.offset,
            "elems": self.elems,
            "encoding": self.encoding,
            "size": self.size,
            "digest": self.digest,
            "changed": self.changed,
        }

    @classmethod
    def from_json(cls, d: dict) -> "ChunkMeta":
        return cls(**{k: d[k] for k in ("offset", "elems", "encoding", "size", "digest", "changed")})


def digest(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def bit_view(dtype: str) -> type:
    try:
        return BIT_VIEWS[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}") from None


# ---------------------------------------------------------------------------------------------- planes

# The hot loops live in kernels.delta (numpy here, Triton on a GPU); re-exported under their old names.
split_planes = delta_kernels.split_planes
join_planes = delta_kernels.join_planes


# ---------------------------------------------------------------------------------------------- chunks


def _compressor(level: int) -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=level, write_content_size=True)


_THREAD = threading.local()


def _scratch() -> delta_kernels.Scratch:
    """This thread's buffers for a chunk's planes, positions and payload, reused chunk after chunk (chunks
    are coded on a pool's threads: one set each, about 3x a chunk's bytes, freed with the thread)."""
    if (scratch := getattr(_THREAD, "scratch", None)) is None:
        scratch = _THREAD.scratch = delta_kernels.Scratch()
    return scratch


def scan_chunk(new: np.ndarray, base: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The encoder's one pass over a chunk (kernels.delta.scan): (planes of the XOR, the changed positions
    when the sparse form wins else None, changed elements), in this thread's scratch until its next chunk."""
    return delta_kernels.scan(new, base, int(SPARSE_MAX_SHARE * new.size), _scratch())


def encode_chunk(new: np.ndarray, base: np.ndarray | None, level: int = DEFAULT_LEVEL) -> tuple[bytes, str, int]:
    """Code one chunk (uint views of equal length, < 2**32 elements). Returns (frame, encoding, changed)."""
    planes, positions, changed = scan_chunk(new, base)
    cctx = _compressor(level)
    if positions is None:  # a full snapshot, or more changed than the sparse form pays for
        return cctx.compress(planes), "planes", changed  # type: ignore[arg-type]  # an ndarray is a buffer
    payload = _scratch().take("payload", _SPARSE_HEADER.size + (4 + new.itemsize) * changed, np.uint8)
    _SPARSE_HEADER.pack_into(payload, 0, changed)  # type: ignore[arg-type]  # an ndarray is a buffer
    delta_kernels.sparse_payload(positions, planes, new.size, payload[_SPARSE_HEADER.size :])
    return cctx.compress(payload), "sparse", changed  # type: ignore[arg-type]  # an ndarray is a buffer


def _sparse_body(raw: bytes, view: type, n: int) -> tuple[np.ndarray, int]:
    """A sparse chunk's payload after its header, and how many changes it holds."""
    itemsize = np.dtype(view).itemsize
    if len(raw) < _SPARSE_HEADER.size:
        raise ValueError(f"sparse chunk of {len(raw)} bytes has no header")
    (k,) = _SPARSE_HEADER.unpack_from(raw)
    if len(raw) != _SPARSE_HEADER.size + k * (4 + itemsize) or k > n:
        raise ValueError(f"sparse chunk of {len(raw)} bytes does not hold {k} changes")
    return np.frombuffer(raw, np.uint8, offset=_SPARSE_HEADER.size), k


def decode_chunk(
    frame: bytes, encoding: str, view: type, n: int, base: np.ndarray | None, out: np.ndarray | None = None
) -> np.ndarray:
    """Rebuild one chunk's bits from its frame and the base chunk (None for a full snapshot), into out
    ((n,) of view, e.g. the chunk's slice of the tensor) or a new array. Returns it."""
    raw = zstandard.ZstdDecompressor().decompress(frame)
    itemsize = np.dtype(view).itemsize
    out = np.empty(n, view) if out is None else out
    if encoding == "planes":
        if len(raw) != n * itemsize:
            raise ValueError(f"planes chunk holds {len(raw)} bytes, expected {n * itemsize}")
        return delta_kernels.join_xor(np.frombuffer(raw, np.uint8), base, out)
    if encoding == "sparse":
        if base is None:
            raise ValueError("a sparse chunk needs a base")
        body, k = _sparse_body(raw, view, n)
        return delta_kernels.sparse_patch(body, k, base, out)
    raise ValueError(f"unknown chunk encoding {encoding!r}")


def changes_into(frame: bytes, meta: ChunkMeta, view: type, idx_out: np.ndarray, xor_out: np.ndarray) -> None:
    """What a delta chunk changes, without the base or the rest of the chunk: into idx_out and xor_out
    (meta.changed each) the positions of its changed elements in the tensor (sorted: meta.offset plus the
    position in the chunk) and their XOR with the base. A sparse chunk costs what changed (one fused pass,
    kernels.delta.sparse_xor); a planes chunk (most of it changed) is decoded whole. ValueError when the
    chunk does not hold meta.changed changes."""
    raw = zstandard.ZstdDecompressor().decompress(frame)
    k, itemsize = meta.changed, np.dtype(view).itemsize
    if meta.encoding == "sparse":
        if len(raw) < _SPARSE_HEADER.size or _SPARSE_HEADER.unpack_from(raw)[0] != k:
            raise ValueError(f"sparse chunk does not hold the {k} changes its manifest entry says")
        if len(raw) != _SPARSE_HEADER.size + k * (4 + itemsize):
            raise ValueError(f"sparse chunk of {len(raw)} bytes does not hold {k} changes")
        body = np.frombuffer(raw, np.uint8, offset=_SPARSE_HEADER.size)
        delta_kernels.sparse_xor(body, k, meta.elems, meta.offset, idx_out, xor_out)
        return
    if meta.encoding != "planes":
        raise ValueError(f"unknown chunk encoding {meta.encoding!r}")
    if len(raw) != meta.elems * itemsize:
        raise ValueError(f"planes chunk holds {len(raw)} bytes, expected {meta.elems * itemsize}")
    x = join_planes(np.frombuffer(raw, np.uint8), view, meta.elems)
    idx = np.flatnonzero(x)
    if idx.size != k:
        raise ValueError(f"planes chunk changes {idx.size} elements, its manifest entry says {k}")
    np.add(idx, meta.offset, out=idx_out, casting="unsafe")
    xor_out[:] = x[idx]


# ---------------------------------------------------------------------------------------------- tensors


def encode_tensor(
    new: np.ndarray,
    base: np.ndarray | None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    level: int = DEFAULT_LEVEL,
    pool: Executor | None = None,
) -> list[tuple[ChunkMeta, bytes]]:
    """new/base: flat uint bit views of one tensor. Chunks are coded in parallel when a pool is given."""
    if base is not None and (base.shape != new.shape or base.dtype != new.dtype):
        raise ValueError(f"base {base.dtype}{base.shape} does not match new {new.dtype}{new.shape}")
    spans = [(o, min(chunk_elems, new.size - o)) for o in range(0, new.size, chunk_elems)] or [(0, 0)]

    def one(span):
        o, n = span
        frame, encoding, changed = encode_chunk(new[o : o + n], None if base is None else base[o : o + n], level)
        return ChunkMeta(o, n, encoding, len(frame), digest(frame), changed), frame

    return list(pool.map(one, spans)) if pool is not None else [one(s) for s in spans]


def decode_tensor(
    chunks: list[tuple[ChunkMeta, bytes]], view: type, numel: int, base: np.ndarray | None, pool: Executor | None = None
) -> np.ndarray:
    """Rebuild a tensor's flat bits; every chunk's digest is checked before it is used."""
    out: np.ndarray = np.empty(numel, dtype=view)
    covered = 0

    def one(item):
        meta, frame = item
        if len(frame) != meta.size or digest(frame) != meta.digest:
            raise ValueError(f"chunk at element {meta.offset}: digest mismatch (truncated or corrupt)")
        o, n = meta.offset, meta.elems
        if o < 0 or o + n > numel:
            raise ValueError(f"chunk at element {o} (+{n}) is outside a tensor of {numel}")
        decode_chunk(frame, meta.encoding, view, n, None if base is None else base[o : o + n], out[o : o + n])
        return n

    for n in pool.map(one, chunks) if pool is not None else map(one, chunks):
        covered += n
    if covered != numel:
        raise ValueError(f"chunks cover {covered} of {numel} elements")
    return out
