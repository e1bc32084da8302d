"""Delta weight sync, side by side in one run.

(a) synthetic bf16 updates (2%, 10%, 30% of elements moved by 1-2 ULP) of a 64 MB tensor: delta size vs
    the raw bytes, vs plain `zstd -1` of the new weights, vs zstd of the XOR without byte planes; encode and
    decode throughput vs a plain zstd -1 pass over the same bytes (same thread count);
(b) consecutive versions of our own model, trained with AdamW in fp32 and published in bf16 (the online RL
    trainer does not exist yet: these are fine-tuning steps of online_rl.model.transformer on the bootstrap corpus);
(c) the agent's peak extra memory while rebuilding a 128 MB checkpoint, against its largest tensor;
(d) hot-switch under load through the gateway: p99 of requests overlapping switches vs steady p99, for a
    fleet of two replicas switching one at a time (drain) and a lone replica (no_pause, retract);
(e) in-place apply vs a full reload from disk on a 1.06 GB checkpoint, at 2% and 30% changed
    (benchmarks/_delta_inplace.py);
(f) publishing to an S3 store (S3Proxy on loopback) vs the directory store (benchmarks/_delta_s3.py);
(g) the peer relay: store bytes out per version and the time until 1, 3 and 6 agents serve it, relays on
    and off (benchmarks/_delta_relay.py).
Prints one JSON object as the last line.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import torch
import zstandard

from benchmarks._store_server import STORE_TOKEN, serve_store
from infra.procs import stop_pid
from weight_sync import codec

THREADS = 2


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _timed(fn, *args, reps=3, **kwargs):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t)
    return out, best


def synthetic() -> dict:
    n = 32 << 20  # 64 MB of bf16
    base = _bf16_bits(torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.02)
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(THREADS)
    out = {}
    raw_mb = base.nbytes
    for share in (0.02, 0.10, 0.30):
        new = base.copy()
        idx = rng.choice(n, int(share * n), replace=False)
        step = rng.choice(np.array([1, -1, 2, -2], np.int32), idx.size, p=[0.4, 0.4, 0.1, 0.1])
        new[idx] = (new[idx].astype(np.int32) + step).astype(np.uint16)
        chunks, t_enc = _timed(codec.encode_tensor, new, base, pool=pool)
        back, t_dec = _timed(codec.decode_tensor, chunks, np.uint16, n, base, pool=pool)
        size = sum(m.size for m, _ in chunks)
        raw = new.tobytes()
        cctx = zstandard.ZstdCompressor(level=1, threads=THREADS)
        plain, t_z = _timed(cctx.compress, raw)
        _, t_zd = _timed(lambda frame: zstandard.ZstdDecompressor().decompress(frame), plain)
        xor_only = zstandard.ZstdCompressor(level=1, threads=THREADS).compress(np.bitwise_xor(new, base).tobytes())
        key = f"{int(share * 100)}pct"
        out[f"ratio_{key}"] = round(raw_mb / size, 1)
        out[f"ratio_xor_zstd_{key}"] = round(raw_mb / len(xor_only), 1)
        out[f"exact_{key}"] = bool(np.array_equal(back, new))
        out[f"encode_gbps_{key}"] = round(raw_mb / t_enc / 1e9, 3)
        out[f"decode_gbps_{key}"] = round(raw_mb / t_dec / 1e9, 3)
        out.setdefault("ratio_plain_zstd", round(raw_mb / len(plain), 2))
        out.setdefault("plain_zstd_gbps", round(raw_mb / t_z / 1e9, 3))
        out.setdefault("plain_zstd_decode_gbps", round(raw_mb / t_zd / 1e9, 3))
        out[f"encodings_{key}"] = sorted({m.encoding for m, _ in chunks})
    out["roundtrip_exact"] = all(v for k, v in out.items() if k.startswith("exact_"))
    out["encode_gbps"], out["decode_gbps"] = out["encode_gbps_2pct"], out["decode_gbps_2pct"]
    out["threads"] = THREADS
    return out


def trainer_versions(tmp: Path) -> dict:
    """Three consecutive versions of the demo model, 10 AdamW steps (lr 1e-6) each, fp32 master weights."""
    from tokenizers import Tokenizer

    from online_rl.model.bootstrap import bootstrap
    from online_rl.model.transformer import load_pretrained, save_pretrained
    from online_rl.tasks import corpus as TC
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish

    src = bootstrap("demo", 0, progress=False)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    model = load_pretrained(src, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    docs = TC.corpus(TC.CorpusConfig(seed=1, documents=400))
    ids = torch.tensor([i for e in tok.encode_batch(docs) for i in e.ids][: 16 * 129]).view(16, 129)
    generate_key(tmp / "k.pem", tmp / "k.pub")
    cfg = PublishConfig(store=tmp / "store", private_key=tmp / "k.pem")
    publish(src, cfg)
    results = []
    for v in (1, 2, 3):
        for _ in range(10):
            out = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                out.logits.reshape(-1, out.logits.shape[-1]), ids[:, 1:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        ckpt = tmp / f"v{v}"
        shutil.copytree(src, ckpt)
        save_pretrained(model, ckpt, torch.bfloat16)
        r = publish(ckpt, cfg)
        results.append({"version": v, "changed_pct": round(100 * r.changed_share, 2), "ratio": round(r.ratio, 1)})
    return {
        "ratio_trainer_versions": [x["ratio"] for x in results],
        "changed_pct_trainer_versions": [x["changed_pct"] for x in results],
        "trainer_versions_note": "10 AdamW steps (lr 1e-6, fp32 master) of online_rl.model.transformer per version; "
        "ratio counts the signed manifest too",
    }


def apply_memory(tmp: Path) -> dict:
    """Peak Python-heap growth (tracemalloc, numpy included) while the agent rebuilds a 2% delta."""
    from safetensors.torch import save_file

    from weight_sync.agent.fetch import StoreClient
    from weight_sync.agent.loop import Agent, AgentConfig
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish

    g = torch.Generator().manual_seed(0)
    tensors = {
        f"model.layers.{i}.w": (torch.randn(4096, 2048, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)
    }
    v0, v1 = tmp / "m0", tmp / "m1"
    for d in (v0, v1):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "synthetic", "tensors": 8}))
    save_file(tensors, str(v0 / "model.safetensors"))
    for k, t in tensors.items():
        bits = t.view(torch.int16)
        tensors[k] = torch.where(torch.rand(t.shape, generator=g) < 0.02, bits + 1, bits).view(torch.bfloat16)
    save_file(tensors, str(v1 / "model.safetensors"))
    generate_key(tmp / "k.pem", tmp / "k.pub")
    cfg = PublishConfig(store=tmp / "store", private_key=tmp / "k.pem")
    publish(v0, cfg)
    publish(v1, cfg)
    proc, url = serve_store(tmp / "store")
    try:
        agent = Agent(
            AgentConfig(
                name="bench",
                replica_url="http://unused",
                store_url=url,
                public_key=tmp / "k.pub",
                work_dir=tmp / "agent",
                initial_model=v0,
                store_token=STORE_TOKEN,
            )
        )

        async def rebuild():
            async with aiohttp.ClientSession() as s:
                client = StoreClient(url, s, tmp / "agent" / "dl", token=STORE_TOKEN)
                return await agent.materialize(client, 1)

        tracemalloc.start()
        base_mem = tracemalloc.get_traced_memory()[0]
        t = time.perf_counter()
        asyncio.run(rebuild())
        seconds = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1] - base_mem
        tracemalloc.stop()
    finally:
        stop_pid(proc.pid)
    total = sum(t.numel() * 2 for t in tensors.values())
    return {
        "apply_peak_extra_mb": round(peak / 2**20, 1),
        "largest_tensor_mb": 16.0,
        "apply_checkpoint_mb": round(total / 2**20, 1),
        "apply_seconds": round(seconds, 2),
    }


async def _load(url: str, key: str, prompts: list[str], stop_at: float, out: list) -> None:
    async with aiohttp.ClientSession() as s:

        async def worker(w: int):
            i = w
            while time.monotonic() < stop_at:
                t = time.monotonic()
                async with s.post(
                    f"{url}/v1/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": "m", "prompt": prompts[i % len(prompts)], "max_tokens": 16, "temperature": 1.0},
                ) as r:
                    ok = r.status == 200
                    await r.read()
                out.append((t, time.monotonic(), ok))
                i += 8

        await asyncio.gather(*(worker(w) for w in range(8)))


def _p99(xs):
    return float(np.percentile(xs, 99)) if xs else float("nan")


def switch_modes(tmp: Path) -> dict:
    """p99 of requests overlapping a switch vs steady p99, per mode, on the demo model."""
    from online_rl.model.bootstrap import bootstrap
    from online_rl.tasks import synthetic as tasks
    from serving import gateway_process
    from serving.replica.process import ReplicaConfig, start as start_replica
    from weight_sync.agent.switch import GatewayLink, switch

    model = bootstrap("demo", 0, progress=False)
    prompts = [t.prompt for t in tasks.tasks("heldout")]
    key, admin = "bench-key", "bench-admin"
    started = []
    out = {}
    try:
        reps = [start_replica(ReplicaConfig(model_path=model, log_dir=tmp / "logs", threads=1)) for _ in range(2)]
        started += reps
        fleet = gateway_process.start([r.url for r in reps], model, tmp / "gw2", keys={"b": key}, admin_token=admin)
        lone = gateway_process.start([reps[0].url], model, tmp / "gw1", keys={"b": key}, admin_token=admin)
        started += [fleet, lone]

        def run(gw_url: str, seconds: float, switches):
            """Load for `seconds`; `switches` (async, timed) runs meanwhile. Returns requests and windows."""
            reqs, windows = [], []

            async def main():
                stop_at = time.monotonic() + seconds
                load = asyncio.create_task(_load(gw_url, key, prompts, stop_at, reqs))
                if switches is not None:
                    await asyncio.sleep(2)
                    await switches(windows)
                await load

            asyncio.run(main())
            return reqs, windows

        def overlapping(reqs, windows):
            return [e - s for s, e, _ in reqs if any(s < w1 and e > w0 for w0, w1 in windows)]

        version = [0]

        def make_switches(mode: str, fleet_mode: bool):
            async def go(windows):
                for _ in range(3):
                    version[0] += 1
                    w0 = time.monotonic()
                    targets = list(enumerate(reps)) if fleet_mode else [(0, reps[0])]
                    pauses = []
                    for i, rep in targets:  # one replica at a time
                        link = GatewayLink(fleet.url, admin, f"r{i}") if fleet_mode else None
                        rpt = await switch(rep.url, str(model), version[0], mode, link)
                        pauses.append(rpt.get("pause_ms", 0.0))
                    windows.append((w0, time.monotonic()))
                    out.setdefault(f"pause_ms_{mode}", []).extend(pauses)
                    await asyncio.sleep(3)

            return go

        for name, gw, mode, fleet_mode in (
            ("fleet_drain", fleet, "drain", True),
            ("lone_no_pause", lone, "no_pause", False),
            ("lone_retract", lone, "retract", False),
        ):
            run(gw.url, 5, None)  # warm-up, not measured
            steady, _ = run(gw.url, 12, None)
            during, windows = run(gw.url, 16, make_switches(mode, fleet_mode))
            out[f"{name}_switch_seconds"] = round(float(np.mean([w1 - w0 for w0, w1 in windows])), 2)
            lat = overlapping(during, windows)
            out[f"{name}_steady_p99_ms"] = round(1000 * _p99([e - s for s, e, _ in steady]), 1)
            out[f"{name}_switch_p99_ms"] = round(1000 * _p99(lat), 1)
            out[f"{name}_p99_ratio"] = round(_p99(lat) / _p99([e - s for s, e, _ in steady]), 2)
            out[f"{name}_failed"] = sum(not ok for _, _, ok in steady + during)
            out[f"{name}_overlapping_requests"] = len(lat)
    finally:
        for thing in reversed(started):
            thing.stop()
    for mode in ("drain", "no_pause", "retract"):
        if f"pause_ms_{mode}" in out:
            out[f"pause_ms_{mode}"] = round(float(np.mean(out[f"pause_ms_{mode}"])), 1)
    out["switch_pause_ms"] = out.get("pause_ms_drain")
    return out


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        result = synthetic()
        from benchmarks._delta_inplace import inplace_vs_reload
        from benchmarks._delta_relay import relay
        from benchmarks._delta_s3 import s3_publish

        parts = (
            ("trainer", trainer_versions),
            ("apply", apply_memory),
            ("switch", switch_modes),
            ("inplace", inplace_vs_reload),
            ("s3", s3_publish),
            ("relay", relay),
        )
        for part, fn in parts:
            d = tmp / part
            d.mkdir()
            result.update(fn(d))
        result["targets_met"] = {
            "ratio_2pct_ge_60": result["ratio_2pct"] >= 60,
            "encode_within_2x_of_zstd": result["encode_gbps"] >= result["plain_zstd_gbps"] / 2,
            "decode_within_2x_of_zstd": result["decode_gbps"] >= result["plain_zstd_decode_gbps"] / 2,
            "fleet_switch_p99_le_1_1x": result.get("fleet_drain_p99_ratio", 99) <= 1.1,
            "lone_switch_p99_le_1_5x": result.get("lone_no_pause_p99_ratio", 99) <= 1.5,
            "apply_memory_bounded_by_tensor": result["apply_peak_extra_mb"] <= 4 * result["largest_tensor_mb"],
            "inplace_vs_reload_2pct_le_0_25": result["inplace_vs_reload_2pct_median"] <= 0.25,
            "store_egress_ratio_6_le_1_5": result["store_egress_ratio_6"] <= 1.5,
            "synthetic_store_egress_ratio_6_le_1_5": result["synthetic_store_egress_ratio_6"] <= 1.5,
        }
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()))
