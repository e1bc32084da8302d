"""Publish time to the S3 store against the directory store, side by side in one run.

A synthetic 64 MB bf16 checkpoint (8 tensors) is published as a full version, then as a delta with 2% of
its elements moved by one ULP: once to a directory store, once to the same plus a bucket on S3Proxy
(filesystem backend, signed requests, full JIT, loopback: the same disk, so the figure is the S3 protocol's
and the upload order's cost, not a network's). Each sequence runs REPS times, alternating, into fresh stores; the
best of each is reported. `s3_publish_vs_dir` = S3 publish time / directory publish time (1.0: free).

    python -m benchmarks._delta_s3      # prints one JSON object
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

REPS = 3  # the first also warms S3Proxy's JIT
TENSORS, ROWS, COLS = 8, 4096, 1024  # 8 x 8 MB of bf16


def _checkpoints(tmp: Path) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        f"model.layers.{i}.w": (torch.randn(ROWS, COLS, generator=g) * 0.02).to(torch.bfloat16) for i in range(TENSORS)
    }
    v0, v1 = tmp / "m0", tmp / "m1"
    for d in (v0, v1):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "synthetic", "tensors": TENSORS}))
    save_file(tensors, str(v0 / "model.safetensors"))
    for k, t in tensors.items():
        bits = t.view(torch.int16)
        tensors[k] = torch.where(torch.rand(t.shape, generator=g) < 0.02, bits + 1, bits).view(torch.bfloat16)
    save_file(tensors, str(v1 / "model.safetensors"))
    return v0, v1


def _sequence(ckpts, cfg) -> tuple[float, float, int]:
    """Publish full then delta; (full seconds, delta seconds, bytes published)."""
    from weight_sync.publish import publish

    times, sent = [], 0
    for c in ckpts:
        t = time.perf_counter()
        r = publish(c, cfg)
        times.append(time.perf_counter() - t)
        sent += r.published_bytes
    return times[0], times[1], sent


def s3_publish(tmp: Path) -> dict:
    from flywheel import s3proxy
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig
    from weight_sync.store.s3 import Bucket, S3Options

    tmp = Path(tmp)
    ckpts = _checkpoints(tmp)
    generate_key(tmp / "k.pem", tmp / "k.pub")
    server = s3proxy.start(s3proxy.S3ProxyConfig(data_dir=tmp / "s3proxy", quick_start=False))
    try:
        server.make_bucket("bench")
        options = S3Options(
            endpoint=server.endpoint, access_key_id=server.access_key, secret_access_key=server.secret_key
        )
        best = {"dir": (float("inf"),) * 3, "s3": (float("inf"),) * 3}
        for rep in range(REPS):
            for kind in ("dir", "s3"):
                store = tmp / f"{kind}-{rep}"
                cfg = PublishConfig(store=store, private_key=tmp / "k.pem")
                if kind == "s3":
                    cfg.s3_url, cfg.s3_options = f"s3://bench/rep{rep}", options
                full, delta, sent = _sequence(ckpts, cfg)
                if full + delta < sum(best[kind][:2]):
                    best[kind] = (full, delta, sent)
                if kind == "s3":
                    assert Bucket(cfg.s3_url, options).versions() == [0, 1]
                shutil.rmtree(store)
    finally:
        server.stop()
    dir_s, s3_s = sum(best["dir"][:2]), sum(best["s3"][:2])
    raw = TENSORS * ROWS * COLS * 2
    return {
        "s3_publish_vs_dir": round(s3_s / dir_s, 2),
        "s3_publish_s": round(s3_s, 3),
        "dir_publish_s": round(dir_s, 3),
        "s3_publish_full_s": round(best["s3"][0], 3),
        "s3_publish_delta_s": round(best["s3"][1], 3),
        "dir_publish_full_s": round(best["dir"][0], 3),
        "dir_publish_delta_s": round(best["dir"][1], 3),
        "s3_checkpoint_mb": round(raw / 2**20, 1),
        "s3_uploaded_mb": round(best["s3"][2] / 2**20, 2),
        "s3_publish_note": f"full + 2% delta of a {raw >> 20} MB bf16 checkpoint, best of {REPS}; S3Proxy "
        "(filesystem backend, full JIT) on loopback, same disk as the directory store",
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as d:
        print(json.dumps(s3_publish(Path(d))))
