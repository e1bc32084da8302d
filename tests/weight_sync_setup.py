"""What the weight sync tests (tests/integration/weight_sync/test_weight_sync*.py) share: a store with v0 (the test
model)
and three deltas behind its HTTP server, with the signing keys (`weights`, one per test module), an agent for a
replica, and how a replica's answers and version are read and compared; and tiny_checkpoint, a two-tensor checkpoint
for the unit tests of the store and its control records.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contracts import replica_keys
from tests.helpers import STORE_TOKEN, get, post, store_server
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

PROMPT = 'def add_three(x):\n    """Return x plus 3."""\n'


def tiny_checkpoint(path: Path, seed: int, base: Path | None = None, with_bias: bool = False) -> Path:
    """A small checkpoint in `path`: a bf16 matrix (and an fp32 bias with `with_bias`), or, given `base`, base's
    weights with 2% of the matrix's elements moved by one bit (a delta's worth of change)."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    if base is None:
        sd = {"model.w1": torch.randn(64, 32, generator=g).to(torch.bfloat16)}
        if with_bias:
            sd["model.b"] = torch.randn(7, generator=g)
    else:
        sd = load_file(str(base / "model.safetensors"))
        m = torch.rand(sd["model.w1"].shape, generator=g) < 0.02
        bits = sd["model.w1"].view(torch.int16)
        sd["model.w1"] = torch.where(m, bits + 1, bits).view(torch.bfloat16)
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "hidden_size": 32}))
    return path


def perturbed(src: Path, dst: Path, seed: int, share: float = 0.02, ulps: int = 1) -> Path:
    """A copy of a checkpoint with `share` of every tensor's bf16 elements moved by a few ULP."""
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for k, v in sd.items():
        mask = torch.rand(v.shape, generator=g) < share
        bits = v.view(torch.int16)
        sd[k] = torch.where(mask, bits + ulps, bits).view(torch.bfloat16)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def weights(test_model, tmp_path_factory):
    """A store with v0 (the test model) and three deltas, its HTTP server, and the signing keys."""
    root = tmp_path_factory.mktemp("weights")
    generate_key(root / "signing.pem", root / "signing.pub")
    cfg = PublishConfig(store=root / "store", private_key=root / "signing.pem")
    ckpts = [test_model]
    publish(test_model, cfg)
    for v in (1, 2, 3):
        ckpts.append(perturbed(ckpts[-1], root / f"ckpt{v}", seed=v, share=0.02, ulps=40 if v == 2 else 1))
        publish(ckpts[-1], cfg)
    with store_server(root / "store") as url:
        yield {"root": root, "cfg": cfg, "url": url, "ckpts": ckpts}


def announce(weights, bootstrap: str, v: int) -> None:
    """Announce an already published version on the weights topic (what publish() does: signed, numbered)."""
    from weight_sync import codec
    from weight_sync.manifest import announcement
    from weight_sync.publish import announce as send

    store = Store(weights["root"] / "store")
    body = (store.version_dir(v) / "manifest.json").read_bytes()
    cfg = PublishConfig(
        store=weights["root"] / "store", private_key=weights["root"] / "signing.pem", kafka_bootstrap=bootstrap
    )
    send(cfg, announcement(store.manifest(v), f"{weights['url']}/versions/{v}/manifest.json", codec.digest(body)))


def _agent(weights, replica, name, work, **kw) -> Agent:
    return Agent(
        AgentConfig(
            name=name,
            replica_url=replica.url,
            store_url=weights["url"],
            public_key=weights["root"] / "signing.pub",
            work_dir=work,
            initial_model=weights["ckpts"][0],
            **{"store_token": STORE_TOKEN, **kw},  # the fleet read credential store_server() wants
        )
    )


def _greedy(url: str) -> list:
    """Greedy tokens and their logprobs: any change of weights shows in the logprobs."""
    status, out, _ = post(
        f"{url}/generate",
        {"text": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 16, "temperature": 0.0}},
        key=replica_keys.inference_key(),
    )
    assert status == 200
    return [(t, lp) for lp, t, _ in out["meta_info"]["output_token_logprobs"]]


def same(a: list, b: list) -> bool:
    """Same tokens, logprobs equal up to float32 reduction noise (a prefix-cache hit alone moves them ~1e-6)."""
    return [t for t, _ in a] == [t for t, _ in b] and all(abs(x - y) < 1e-5 for (_, x), (_, y) in zip(a, b))


def _version(url: str) -> str:
    return json.loads(get(f"{url}/model_info", key=replica_keys.inference_key())[1])["weight_version"]
