"""`flywheel numerics`: how far the trainer's logprobs of served tokens are from the ones SGLang served.

Prompts (held-out tasks) are sampled on a real replica with logprobs and routed experts; the trainer's
model then scores the same tokens twice: replaying the experts serving chose, and routing on its own.
Reported per mode: max and mean absolute logprob difference over served tokens, and the share of
(position, layer) routing decisions that differ from serving's.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path

import numpy as np
import torch

from contracts import replica_keys
from online_rl.model.transformer import load_pretrained, token_logprobs
from online_rl.tasks import synthetic as tasks


def _generate(url: str, ids: list[int], max_tokens: int, temperature: float, seed: int) -> dict:
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_routed_experts": True,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature, "sampling_seed": seed},
    }
    req = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **replica_keys.inference_headers()},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def measure(
    replica_url: str, model_dir: Path, prompts: int = 16, max_tokens: int = 24, temperature: float = 1.0, seed: int = 0
) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    model = load_pretrained(model_dir, torch.float32).eval()
    L, K = model.cfg.num_hidden_layers, model.cfg.num_experts_per_tok
    diffs: dict[str, list[torch.Tensor]] = {"replay": [], "no_replay": []}
    disagree = {"replay": [0, 0], "no_replay": [0, 0]}
    for i, task in enumerate(tasks.tasks("heldout", seed)[:prompts]):
        ids = tok.encode(task.prompt).ids
        out = _generate(replica_url, ids, max_tokens, temperature, seed + i)
        output = out["output_ids"]
        if not output:
            continue
        served_lp = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        seq = torch.tensor([ids + output])
        experts = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), np.int32)
        served = torch.from_numpy(experts.copy()).view(1, seq.shape[1] - 1, L, K).long()
        for mode, replay in (("replay", served), ("no_replay", None)):
            with torch.no_grad():
                res = model(seq[:, :-1], replay_experts=replay)
            lp = token_logprobs(res.logits, seq[:, 1:])[0, len(ids) - 1 :]
            diffs[mode].append((lp - served_lp).abs())
            same = (res.experts.sort(-1).values == served.sort(-1).values).all(-1)  # (1, T, L)
            disagree[mode][0] += int((~same).sum())
            disagree[mode][1] += same.numel()
    report: dict[str, object] = {
        "prompts": prompts,
        "tokens": int(sum(d.numel() for d in diffs["replay"])),
        "temperature": temperature,
    }
    for mode in ("replay", "no_replay"):
        d = torch.cat(diffs[mode])
        report[mode] = {
            "max_abs_logprob_diff": float(d.max()),
            "mean_abs_logprob_diff": float(d.mean()),
            "routing_disagreement": disagree[mode][0] / max(1, disagree[mode][1]),
        }
    return report
