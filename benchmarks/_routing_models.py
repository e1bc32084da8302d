"""The models the routing benchmark (benchmarks.routing) serves, made from the test-preset checkpoint without
training: `long_context_view` (the test model with 8192 positions) and `prefill_heavy_view` (its tokenizer, a wider
shape with random weights, whose prefill is most of a miss's time to first token), and what the traffic is sized by
(characters per token, the stop tokens).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from loadtests import ide_prefix as ide

POSITIONS = 8192


def long_context_view(model: Path, out: Path) -> Path:
    """The same checkpoint with more positions (rotary embeddings extend; nothing is retrained)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.name != "config.json" and f.is_file():
            (out / f.name).symlink_to(f)
    cfg = json.loads((model / "config.json").read_text())
    cfg["max_position_embeddings"] = POSITIONS
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


# A model whose prefill costs what it does on a production model relative to the rest of a request: the
# test model (222k parameters) prefills a 2k-token miss almost as fast as a 200-token hit, so a cache hit
# barely shows in its TTFT. Same tokenizer, wider, random weights (SGLang's --load-format dummy: what it
# writes is noise, the routing and the caches are what is measured). Its work is in the experts, not in
# attention, because the torch_native attention backend our CPU replicas use (torch_native_backend.py,
# `per_req_query_redudant`) pads an extend's queries to the whole sequence and runs attention over all of
# it, cached prefix included: a hit there saves only the projections and experts. A GPU backend (FlashInfer,
# FA3) computes attention for the new tokens only (over the whole prefix), so a hit costs a small share of a
# miss there. With attention dominating (hidden 384, 6 heads, 4 layers, experts of 256), a 190-token hit on
# a 4k-token prompt took 1.35-1.7 s against 3.6 s for the miss (2k: 0.45-0.8 s against 0.8-1.0 s); with
# this shape 0.65-0.71 s against 2.5 s (2k: 0.23-0.36 s against 0.9-1.1 s)
# (one idle replica, one thread; the run records its own in `setup.probe_ttft_ms`), still a larger share
# than on a GPU.
PREFILL_HEAVY = {
    "hidden_size": 512,
    "intermediate_size": 1024,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 8,
    "max_window_layers": 2,
}


def prefill_heavy_view(model: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            (out / f.name).symlink_to(f)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(PREFILL_HEAVY, max_position_embeddings=POSITIONS)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def chars_per_token(model: Path) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = ide.synthetic_file(random.Random(1), 20_000)
    return len(text) / len(tok.encode(text).ids)


def stop_ids(model: Path) -> list[int]:
    """What our gateway stops a completion at (serving.protocol.prompts): the end of text and the FIM markers."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    marks = ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    return sorted(i for t in marks if (i := tok.token_to_id(t)) is not None)
