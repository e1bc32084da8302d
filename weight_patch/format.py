"""In-place weight patches: what a weights agent hands the SGLang engine next to it, instead of a whole
checkpoint to re-read. The one module that says what a patch file holds; the agent writes it
(weight_patch.writer, called by weight_sync.agent.inplace), the engine's loader applies it (weight_patch.loader).

A patch is one safetensors file on the replica's host. For each tensor that changed, by its checkpoint
(Hugging Face) name, either
    "<name>"                 the whole new tensor, or
    "<name>#idx"             the flat positions of the changed elements (int32, or int64 past 2**31),
    "<name>#xor"             the XOR of their new bits with the base's,
    "<name>#was"             the base's bits at the first WAS_SAMPLE of them,
the second while few elements changed (SPARSE_MAX_SHARE), the whole tensor past that. An XOR costs the
agent no read of the base (whose every cache line a 2% change touches), but it is right only on the base
and only once: applied twice it gives the base back, under the new version's label. So the loader applies
it only where the model holds the "#was" bits: every one of those positions changes, so a second
application is always refused, before anything is written. That the replica serves the base at all is
the agent's check (the version it reports); the "#was" bits catch another version only where it differs
from the base at those positions (likely, not certain).
Values are stored as their bit patterns (numpy has no bfloat16); the metadata names each tensor's dtype
and shape. The engine is told where the file is through `update_weights_from_tensor` (the only way an
HTTP caller hands SGLang's custom loader anything): one one-element tensor named PATH_PREFIX + path.
SGLang reports success whatever a custom loader does (and an exception there would stop its scheduler),
so the loader writes its outcome next to the patch (result_path), and the agent reads it.
"""

from __future__ import annotations

import json
import os

PATH_PREFIX = "flywheel-patch:"
IDX, XOR, WAS = "#idx", "#xor", "#was"
WAS_SAMPLE = 64  # base bits a sparse entry carries: each changed, so a repeated XOR never matches them
META_KEY = "flywheel.patch"  # metadata: JSON {name: [dtype, shape]} for every patched tensor
LOADER = "weight_patch.loader.apply"  # the engine's --custom-weight-loader, and the load_format to ask for

# safetensors dtype -> the signed integer view its bits travel as (numpy writes it, torch reads it back)
BIT_DTYPES = {"BF16": "int16", "F16": "int16", "F32": "int32"}
# Sparse only while few changed: an engine scatters a position ~30x slower than it copies an element
# (benchmarks.delta, 1 GB at 30% changed: scattering took longer than reloading the whole checkpoint).
SPARSE_MAX_SHARE = 0.05


def travels_sparse(changed: int, numel: int) -> bool:
    """Whether a tensor with `changed` of `numel` elements changed travels as positions and values."""
    return changed <= SPARSE_MAX_SHARE * numel


def encode_meta(specs: dict[str, tuple[str, list[int]]]) -> dict[str, str]:
    return {META_KEY: json.dumps({n: [d, list(s)] for n, (d, s) in specs.items()}, separators=(",", ":"))}


def decode_meta(metadata: dict[str, str] | None) -> dict[str, tuple[str, list[int]]]:
    if not metadata or META_KEY not in metadata:
        raise ValueError("not a flywheel weight patch (no patch metadata)")
    return {n: (d, list(s)) for n, (d, s) in json.loads(metadata[META_KEY]).items()}


def result_path(patch: str) -> str:
    return patch + ".result"


def valid_path(patch: str) -> bool:
    """A patch is named by an absolute path to a .safetensors file (the engine resolves nothing itself)."""
    return os.path.isabs(patch) and patch.endswith(".safetensors") and "\x00" not in patch


def write_result(patch: str, result: dict) -> None:
    tmp = result_path(patch) + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    # Never through a link planted where the result goes: the engine writes with its own rights.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path(patch))


def read_result(patch: str) -> dict:
    """The loader's outcome; a missing or unreadable one is a failure (the loader never ran)."""
    try:
        with open(result_path(patch)) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        return {"ok": False, "error": f"no outcome from the engine's loader ({type(e).__name__})"}
    return result if isinstance(result, dict) else {"ok": False, "error": "malformed outcome"}
