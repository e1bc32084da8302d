"""A candidate that does not rebuild as signed (a chunk altered in the store) is blocked by the gate, with the
reason in its record, before any suite runs: the follower's queue moves on and the block's alert fires."""

from __future__ import annotations

import dataclasses
import json

import torch
from safetensors.torch import load_file, save_file

from online_rl.gate.run import GateConfig, run_gate
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store


def _ckpt(path, seed, base=None):
    path.mkdir(parents=True)
    if base is None:
        sd = {"model.w": torch.randn(64, 32, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)}
    else:
        sd = load_file(str(base / "model.safetensors"))
        sd["model.w"] = (sd["model.w"].float() * 1.01).to(torch.bfloat16)
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    return path


def test_a_candidate_altered_in_the_store_is_blocked_unjudged(tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    pcfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem")
    c0 = _ckpt(tmp_path / "c0", 0)
    publish(c0, pcfg)
    store = Store(pcfg.store)
    store.mark_announced(0)
    publish(_ckpt(tmp_path / "c1", 1, base=c0), pcfg, announce_now=False)
    chunk = sorted((store.version_dir(1) / "chunks").iterdir())[0]
    chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 1]))

    r = run_gate(GateConfig(publish=dataclasses.replace(pcfg)), 1, 0)
    assert r.verdict == "block" and "does not rebuild as signed" in r.judgement.reason, r.judgement.reason
    assert store.gate_blocked() == {1} and store.announced() == 0
    seconds = r.record["figures"]["seconds"]
    assert "verification" in r.record["figures"] and "candidate" not in seconds and seconds["baseline"] == 0.0
