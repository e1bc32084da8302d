"""The weight store on S3, against a real S3 server (S3Proxy, signed requests; the `s3proxy` fixture):
publish full then delta, an agent rebuilds bit-identical weights through the bucket, a half-done publish
is invisible, retention empties the bucket of old versions, broken downloads resume with range gets,
corrupt objects are refused, bad URLs and unreachable endpoints fail with a clear error.

Why one file: every test here shares the S3 server and a bucket.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import obstore
import pytest
import torch
from safetensors.torch import load_file, save_file

from infra.paths import REPO_ROOT
from infra.procs import free_port, pid_alive
from weight_sync.agent.fetch import FetchError
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.agent.s3_fetch import S3StoreClient
from weight_sync.agent.stores import open_store
from weight_sync.manifest import Manifest, generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store import s3 as s3_store
from weight_sync.store.s3 import Bucket, S3Options, S3StoreError
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(180)
BUCKET = "weights"


def perturbed(src: Path, dst: Path, seed: int, share: float = 0.02) -> Path:
    """A copy of a checkpoint with `share` of every tensor's bf16 elements moved by one ULP."""
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for k, v in sd.items():
        if v.dtype == torch.bfloat16:
            bits = v.view(torch.int16)
            sd[k] = torch.where(torch.rand(v.shape, generator=g) < share, bits + 1, bits).view(torch.bfloat16)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def s3(s3proxy):
    s3proxy.make_bucket(BUCKET)
    return {
        "server": s3proxy,
        "options": S3Options(
            endpoint=s3proxy.endpoint,
            access_key_id=s3proxy.access_key,
            secret_access_key=s3proxy.secret_key,
            retries=1,
            timeout_s=20,
        ),
    }


@pytest.fixture(scope="module")
def published(s3, test_model, tmp_path_factory):
    """v0 (the test model, full) and v1 (2% of it moved, a delta) published to s3://weights/main."""
    root = tmp_path_factory.mktemp("s3-publish")
    generate_key(root / "k.pem", root / "k.pub")
    url = f"s3://{BUCKET}/main"
    cfg = PublishConfig(store=root / "store", private_key=root / "k.pem", s3_url=url, s3_options=s3["options"])
    ckpt1 = perturbed(test_model, root / "ckpt1", seed=1)
    results = [publish(test_model, cfg), publish(ckpt1, cfg)]
    return {"root": root, "url": url, "cfg": cfg, "results": results, "ckpts": [test_model, ckpt1]}


def _client(s3, url: str, tmp: Path, **kw) -> S3StoreClient:
    return S3StoreClient(url, tmp / "dl", options=s3["options"], **kw)


def test_full_then_delta_rebuilds_bit_identical_through_the_bucket(s3, published, monkeypatch, tmp_path):
    r0, r1 = published["results"]
    assert (r0.kind, r1.kind, r1.base_version) == ("full", "delta", 0)
    url = published["url"]
    assert r1.announcement["manifest"] == f"{url}/versions/1/manifest.json"  # agents are sent to the bucket
    # The publisher keeps its directory store too (head/ is the next delta's base; versions/ retained as before).
    assert Store(published["cfg"].store).versions() == [0, 1]
    assert Bucket(url, s3["options"]).versions() == [0, 1]

    # The agent's way in: a store URL, endpoint and credentials from the standard AWS_* variables.
    for k, v in s3["server"].env().items():
        monkeypatch.setenv(k, v)
    agent = Agent(
        AgentConfig(
            name="a",
            replica_url="http://unused",
            store_url=url,
            public_key=published["root"] / "k.pub",
            work_dir=tmp_path / "agent",
            initial_model=published["ckpts"][0],
        )
    )

    async def rebuild():
        async with aiohttp.ClientSession() as session:
            client = open_store(url, session, tmp_path / "dl", 4)
            assert isinstance(client, S3StoreClient)
            listed = await client.versions()
            return listed, await agent.materialize(client, 1), client

    listed, path, client = asyncio.run(rebuild())
    assert listed["versions"] == [0, 1]
    # v0 was the agent's own initial model: only the delta came over the wire.
    assert 0 < client.bytes_downloaded < r1.raw_bytes / 5
    want = load_file(str(published["ckpts"][1] / "model.safetensors"))
    got = load_file(str(path / "model.safetensors"))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k].view(torch.uint8), got[k].view(torch.uint8)), k
    assert (path / "config.json").read_bytes() == (published["ckpts"][1] / "config.json").read_bytes()


def test_a_publish_that_dies_before_its_manifest_is_invisible(s3, test_model, monkeypatch, tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    url = f"s3://{BUCKET}/atomic"
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem", s3_url=url, s3_options=s3["options"])
    publish(test_model, cfg)
    bucket, client = Bucket(url, s3["options"]), _client(s3, url, tmp_path)

    def killed():
        raise KeyboardInterrupt("publisher killed before the manifest")

    # Every chunk, side file and the signature of v1 go up; the publisher dies before manifest.json.
    upload = Bucket.upload
    monkeypatch.setattr(Bucket, "upload", functools.partialmethod(upload, before_manifest=killed))
    ckpt1 = perturbed(test_model, tmp_path / "ckpt1", seed=3)
    with pytest.raises(KeyboardInterrupt):
        publish(ckpt1, cfg)
    monkeypatch.setattr(Bucket, "upload", upload)
    half = [o["path"] for batch in obstore.list(bucket.store, "versions/1/") for o in batch]
    assert any(p.endswith("manifest.sig") for p in half) and sum("/chunks/" in p for p in half) > 10
    assert bucket.versions() == [0]
    assert asyncio.run(client.versions())["versions"] == [0]
    with pytest.raises(FetchError, match="not in the store"):
        asyncio.run(client.manifest(1))
    assert Store(cfg.store).versions() == [0] and not list(cfg.store.glob(".staging-*"))

    # The next publish takes the number again, clears the leftovers, and is whole.
    r = publish(ckpt1, cfg)
    assert r.version == 1 and bucket.versions() == [0, 1]
    body, sig = asyncio.run(client.manifest(1))
    assert Manifest.parse(body).version == 1 and sig


def test_retention_deletes_old_versions_from_the_bucket(s3, test_model, tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    url = f"s3://{BUCKET}/retain"
    cfg = PublishConfig(
        store=tmp_path / "store",
        private_key=tmp_path / "k.pem",
        s3_url=url,
        s3_options=s3["options"],
        full_every=2,
        keep=1,
    )
    prev = test_model
    for v in range(4):
        prev = prev if v == 0 else perturbed(prev, tmp_path / f"c{v}", seed=10 + v)
        publish(prev, cfg)
    bucket = Bucket(url, s3["options"])
    assert Store(cfg.store).versions() == [2, 3]  # v3 and the full snapshot it needs
    assert bucket.versions() == [2, 3]
    for gone in (0, 1):
        assert not [o for batch in obstore.list(bucket.store, f"versions/{gone}/") for o in batch if o["size"]]


def test_an_interrupted_chunk_download_resumes_with_a_range_get(s3, published, tmp_path):
    url = published["url"]
    m = Manifest.parse(asyncio.run(_client(s3, url, tmp_path).manifest(0))[0])
    t, entry = max(enumerate(m.tensors), key=lambda te: te[1].chunks[0].size)
    meta = entry.chunks[0]
    whole = bytes(obstore.get(Bucket(url, s3["options"]).store, f"versions/0/chunks/{t}.0").bytes())
    assert len(whole) == meta.size > 1000

    # What a transfer that broke half-way leaves: the first half in the .part file.
    client = _client(s3, url, tmp_path)
    half = meta.size // 2
    (tmp_path / "dl" / f"v0-{t}.0.part").write_bytes(whole[:half])
    assert asyncio.run(client.chunk(0, t, 0, meta.size, meta.digest)) == whole
    assert client.resumed == 1 and client.bytes_downloaded == meta.size - half
    assert not list((tmp_path / "dl").glob("*.part"))

    # A .part that is not this object's head: the digest says so, and the chunk is fetched whole again.
    client = _client(s3, url, tmp_path)
    (tmp_path / "dl" / f"v0-{t}.0.part").write_bytes(b"\0" * half)
    assert asyncio.run(client.chunk(0, t, 0, meta.size, meta.digest)) == whole
    assert client.bytes_downloaded == meta.size - half + meta.size


def test_a_corrupt_object_is_refused_by_its_digest(s3, test_model, tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    url = f"s3://{BUCKET}/corrupt"
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem", s3_url=url, s3_options=s3["options"])
    publish(test_model, cfg)
    m = Store(cfg.store).manifest(0)
    meta = m.tensors[0].chunks[0]
    bucket = Bucket(url, s3["options"])
    good = bytes(obstore.get(bucket.store, "versions/0/chunks/0.0").bytes())
    obstore.put(bucket.store, "versions/0/chunks/0.0", bytes(b ^ 0x55 for b in good))  # same size, other bytes
    client = _client(s3, url, tmp_path)
    with pytest.raises(FetchError, match="digest mismatch"):
        asyncio.run(client.chunk(0, 0, 0, meta.size, meta.digest))
    name, want = next(iter(m.files.items()))
    obstore.put(bucket.store, f"versions/0/files/{name}", b"{}")
    with pytest.raises(FetchError, match="digest mismatch"):
        asyncio.run(client.file(0, name, want))


def test_an_anonymous_client_reads_and_writes_nothing(s3, published):
    """The bucket holds every version: S3Proxy checks each request's AWS signature (aws-v2-or-v4 with an
    identity and credential), so an unsigned GET, listing or PUT from anyone on the network is a 403."""
    import urllib.error
    import urllib.request

    endpoint = s3["server"].endpoint
    manifest = f"{endpoint}/{BUCKET}/main/versions/1/manifest.json"
    for url, method, data in (
        (manifest, "GET", None),
        (f"{endpoint}/{BUCKET}/main/versions/0/chunks/0.0", "GET", None),
        (f"{endpoint}/{BUCKET}?list-type=2&prefix=main/", "GET", None),
        (f"{endpoint}/", "GET", None),
        (f"{endpoint}/{BUCKET}/main/versions/9/manifest.json", "PUT", b"{}"),
        (manifest, "DELETE", None),
    ):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=20)
        assert e.value.code == 403, (method, url)
    signed = S3StoreClient(published["url"], published["root"] / "dl", options=s3["options"])
    assert json.loads(asyncio.run(signed.manifest(1))[0])["version"] == 1  # the fleet's signed GET still works


@pytest.mark.parametrize(
    "url, match",
    [
        ("http://bucket/x", "expected s3://BUCKET"),
        ("s3://", "not a bucket name"),
        ("s3://Bad_Bucket/x", "not a bucket name"),
        ("s3://weights/a/../b", "prefix segment"),
        ("s3://weights/a//b", "prefix segment"),
    ],
)
def test_a_malformed_url_is_refused(url, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        S3StoreClient(url, tmp_path)
    with pytest.raises(ValueError, match=match):
        Bucket(url)


def test_unreachable_endpoint_bad_credentials_and_missing_bucket(s3, test_model, tmp_path, capsys, monkeypatch):
    good = s3["options"]
    dead = S3Options(**{**good.__dict__, "endpoint": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(S3StoreError, match="endpoint unreachable"):
        asyncio.run(S3StoreClient(f"s3://{BUCKET}/main", tmp_path, options=dead).versions())
    wrong = S3Options(**{**good.__dict__, "secret_access_key": "not-the-secret"})
    with pytest.raises(S3StoreError, match="credentials refused"):
        asyncio.run(S3StoreClient(f"s3://{BUCKET}/main", tmp_path, options=wrong).manifest(0))
    with pytest.raises(S3StoreError, match="no such bucket"):
        Bucket("s3://no-such-bucket/x", good).versions()
    with pytest.raises(ValueError, match="bad S3 endpoint"):
        Bucket(f"s3://{BUCKET}/x", S3Options(endpoint="127.0.0.1:9000"))

    # A publish that cannot reach the bucket publishes nothing, locally either.
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    cfg = PublishConfig(
        store=tmp_path / "store", private_key=tmp_path / "k.pem", s3_url="s3://weights/x", s3_options=dead
    )
    with pytest.raises(S3StoreError, match="unreachable"):
        publish(test_model, cfg)
    assert Store(cfg.store).versions() == []

    # The CLI says it in one line.
    from flywheel.cli import main

    args = ["weights", "publish", "--checkpoint", str(test_model), "--store", str(cfg.store)]
    args += ["--key", str(tmp_path / "k.pem")]
    assert main([*args, "--s3-url", "s3://Not A Bucket"]) == 1
    assert "bad S3 URL" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead.endpoint)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    assert main([*args, "--s3-url", "s3://weights/x"]) == 1
    assert "no credentials (set AWS_ACCESS_KEY_ID" in capsys.readouterr().err
    for k, v in {**s3["server"].env(), "AWS_ENDPOINT_URL": dead.endpoint}.items():
        monkeypatch.setenv(k, v)
    assert main([*args, "--s3-url", "s3://weights/x"]) == 1
    assert "endpoint unreachable" in capsys.readouterr().err

    # An agent treats an unreachable bucket as transient (retried), never as a bad version.
    agent = Agent(
        AgentConfig(
            name="a",
            replica_url="http://unused",
            store_url=f"s3://{BUCKET}/main",
            public_key=tmp_path / "k.pub",
            work_dir=tmp_path / "agent",
            initial_model=test_model,
            retry_base_s=0.01,
        )
    )
    assert asyncio.run(agent.apply(1)) is None and agent.retry


def test_s3_store_module_has_no_bucket_side_effects_at_construction(tmp_path):
    """Constructing clients contacts nothing (a publisher or agent starts while the bucket is away)."""
    opts = S3Options(endpoint=f"http://127.0.0.1:{free_port()}", access_key_id="a", secret_access_key="b")
    Bucket(f"s3://{BUCKET}/x", opts)
    S3StoreClient(f"s3://{BUCKET}/x", tmp_path, options=opts)
    assert s3_store.parse_url(f"s3://{BUCKET}/a/b/") == (BUCKET, "a/b")


def test_s3proxy_dies_with_the_process_that_started_it(tmp_path):
    """An interrupted run (pytest killed -9) leaves no S3 server behind: spawn's death signal ends it."""
    child = (
        "import json, sys, time; from pathlib import Path; from flywheel import s3proxy; "
        "s = s3proxy.start(s3proxy.S3ProxyConfig(data_dir=Path(sys.argv[1]))); "
        "print(json.dumps(s.pid), flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(tmp_path / "s3")],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = json.loads(proc.stdout.readline())
        assert pid_alive(pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(pid)
