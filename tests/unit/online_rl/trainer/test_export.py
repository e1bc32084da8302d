"""The trainer's streamed export (online_rl/trainer/export.py): safetensors bytes any reader takes, the tied head
left out, and a failed write raised only after every tensor was gathered."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file

from online_rl.model.transformer import ModelConfig, MoECoder, load_pretrained, save_pretrained
from online_rl.trainer.export import save_streaming

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tied", [False, True])
def test_streamed_file_is_what_save_pretrained_writes(tmp_path, dtype, tied):
    m = MoECoder(ModelConfig(**TINY, tie_word_embeddings=tied))
    m.init_weights(3)
    save_streaming(m, tmp_path / "streamed", dtype)
    save_pretrained(m, tmp_path / "whole", dtype)
    a, b = load_file(tmp_path / "streamed" / "model.safetensors"), load_file(tmp_path / "whole" / "model.safetensors")
    assert a.keys() == b.keys() and ("lm_head.weight" in a) == (not tied)
    assert all(a[k].dtype == dtype and torch.equal(a[k], b[k]) for k in a)
    raw = (tmp_path / "streamed" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0 and json.loads(raw[8 : 8 + n])["__metadata__"] == {"format": "pt"}
    (tmp_path / "streamed" / "config.json").write_text((tmp_path / "whole" / "config.json").read_text())
    again = load_pretrained(tmp_path / "streamed")  # and the trainer reads it back
    assert all(torch.equal(again.state_dict()[k], m.state_dict()[k].to(dtype).float()) for k in a)


class _Counting(torch.nn.Module):
    """Counts the tensors state_dict hands out (what the gathering iterates over)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, 0

    def state_dict(self, *a, **k):
        sd = self.inner.state_dict()
        outer = self

        class _Dict(dict):
            def items(self):
                for kv in super().items():
                    outer.seen += 1
                    yield kv

        return _Dict(sd)


def test_a_failed_write_is_raised_after_every_tensor_was_gathered(tmp_path):
    m = MoECoder(ModelConfig(**TINY))
    m.init_weights(0)
    counting = _Counting(m)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(OSError):
        save_streaming(counting, blocker / "out")
    assert counting.seen == 2 * len(m.state_dict())  # metadata, then every tensor gathered: no rank left waiting
    assert not (blocker / "out").exists()
