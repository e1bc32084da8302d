"""The store's pack (/versions/N/changed): every chunk an in-place apply needs, in one response.

A real store server (`flywheel weights serve`) over a published delta; between it and the client, where a
test needs one, a loopback proxy that cuts the response short, damages a byte of it, or does not know the
pack (a store server older than it).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web
from safetensors.numpy import load_file
from safetensors.torch import save_file

from infra.procs import free_port
from tests.helpers import STORE_TOKEN, get, loopback_app, store_server
from weight_sync.agent import inplace
from weight_sync.agent.fetch import FetchError, PackUnsupported, StoreClient
from weight_sync.manifest import Manifest, generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store, chunk_name

pytestmark = pytest.mark.timeout(180)
AUTH = {"Authorization": f"Bearer {STORE_TOKEN}"}  # the fleet read credential store_server() wants


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """v0 (6 bf16 tensors) and v1: 2% of the elements of four of them moved by 1 ULP, in small chunks."""
    root = tmp_path_factory.mktemp("pack-weights")
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.w": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(6)}

    def checkpoint(d: Path) -> Path:
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "synthetic"}))
        save_file(tensors, str(d / "model.safetensors"))
        return d

    v0 = checkpoint(root / "v0")
    for i in range(4):
        bits = tensors[f"layers.{i}.w"].view(torch.int16)
        moved = torch.rand(bits.shape, generator=g) < 0.02
        tensors[f"layers.{i}.w"] = torch.where(moved, bits + 1, bits).view(torch.bfloat16)
    v1 = checkpoint(root / "v1")
    generate_key(root / "k.pem", root / "k.pub")
    cfg = PublishConfig(store=root / "store", private_key=root / "k.pem", chunk_elems=1 << 16)  # 4 chunks a tensor
    publish(v0, cfg)
    publish(v1, cfg)
    store = Store(root / "store")
    manifest = store.manifest(1)
    chunks = store.version_dir(1) / "chunks"
    pack = b"".join((chunks / chunk_name(t, c)).read_bytes() for t, c, _ in manifest.pack())
    return {"root": root, "v0": v0, "v1": v1, "manifest": manifest, "pack": pack}


@pytest.fixture(scope="module")
def store(published):
    with store_server(published["root"] / "store") as url:
        yield url


def test_the_pack_is_every_chunk_of_every_changed_tensor_back_to_back(published, store):
    m: Manifest = published["manifest"]
    assert m.changed_tensors() == [0, 1, 2, 3]
    assert [(t, c) for t, c, _ in m.pack()] == [(t, c) for t in range(4) for c in range(4)]
    import urllib.request

    before = json.loads(get(f"{store}/stats", key=STORE_TOKEN)[1])["sent_bytes"]["chunk"]
    req = urllib.request.Request(f"{store}/versions/1/changed", headers=AUTH)
    with urllib.request.urlopen(req, timeout=30) as r:
        status, body = r.status, r.read()
    assert status == 200 and body == published["pack"]
    assert json.loads(get(f"{store}/stats", key=STORE_TOKEN)[1])["sent_bytes"]["chunk"] - before == len(body)


def test_a_range_resumes_the_pack_and_a_range_it_cannot_serve_is_416(published, store):
    import urllib.error
    import urllib.request

    pack = published["pack"]

    def ranged(spec: str) -> tuple[int, bytes, str]:
        req = urllib.request.Request(f"{store}/versions/1/changed", headers={"Range": spec, **AUTH})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read(), r.headers.get("Content-Range", "")
        except urllib.error.HTTPError as e:
            return e.code, b"", e.headers.get("Content-Range", "")

    assert ranged("bytes=1000-") == (206, pack[1000:], f"bytes 1000-{len(pack) - 1}/{len(pack)}")
    assert ranged(f"bytes={len(pack)}-")[::2] == (416, f"bytes */{len(pack)}")
    assert ranged("bytes=0-10")[0] == 416  # only "from N to the end" is served
    assert get(f"{store}/versions/9/changed", key=STORE_TOKEN)[0] == 404
    assert get(f"{store}/versions/0/changed", key=STORE_TOKEN)[0] == 404  # a full snapshot has no pack: chunk by chunk
    head = urllib.request.Request(f"{store}/versions/1/changed", method="HEAD", headers=AUTH)
    with urllib.request.urlopen(head, timeout=30) as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) == len(pack) and r.read() == b""


async def _proxy(target: str, how: str) -> tuple[web.AppRunner, str, dict]:
    """A loopback proxy in front of the store: `cut` ends the first pack response halfway; `damage` flips a
    byte of the pack's third chunk (the chunk itself, asked alone, is intact); `extra` sends junk after the
    pack; `old` answers 404 for the pack. Returns its runner, URL and what it saw."""
    seen = {"pack": 0, "ranges": [], "chunks": 0}

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/changed"):
            seen["pack"] += 1
            seen["ranges"].append(request.headers.get("Range"))
            if how == "old":
                raise web.HTTPNotFound()
        else:
            seen["chunks"] += "/chunks/" in request.path
        async with aiohttp.ClientSession() as s:
            async with s.get(target + request.path_qs, headers=dict(request.headers)) as r:
                body = await r.read()
                out = web.StreamResponse(status=r.status)
                if "Content-Range" in r.headers:
                    out.headers["Content-Range"] = r.headers["Content-Range"]
                out.content_length = len(body) + (
                    1 << 20 if how == "extra" and request.path.endswith("/changed") else 0
                )
                await out.prepare(request)
                if request.path.endswith("/changed") and how == "cut" and seen["pack"] == 1:
                    await out.write(body[: len(body) // 2])
                    request.transport.close()  # the connection breaks off mid-body
                    return out
                if request.path.endswith("/changed") and how == "damage":
                    body = bytearray(body)
                    body[seen["third"]] ^= 0xFF
                if request.path.endswith("/changed") and how == "extra":
                    body += b"\0" * (1 << 20)
                await out.write(bytes(body))
                return out

    runner, url = await loopback_app(handle)
    return runner, url, seen


def _pack_through(published, store, how: str, tmp_path) -> tuple[dict, dict, StoreClient]:
    m: Manifest = published["manifest"]
    sizes = [meta.size for _, _, meta in m.pack()]

    async def main():
        runner, url, seen = await _proxy(store, how)
        seen["third"] = sizes[0] + sizes[1] + 5
        try:
            async with aiohttp.ClientSession() as s:
                client = StoreClient(url, s, tmp_path / "dl", token=STORE_TOKEN)
                got: dict = {}
                await client.pack(1, m.pack(), lambda t, c, data: got.setdefault((t, c), []).append(data))
                return got, seen, client
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _assert_every_chunk_once(published, got: dict) -> None:
    chunks = Store(published["root"] / "store").version_dir(1) / "chunks"
    assert sorted(got) == [(t, c) for t, c, _ in published["manifest"].pack()]
    for (t, c), copies in got.items():
        assert copies == [(chunks / chunk_name(t, c)).read_bytes()], (t, c)


def test_a_pack_cut_short_resumes_where_it_stopped(published, store, tmp_path):
    got, seen, client = _pack_through(published, store, "cut", tmp_path)
    _assert_every_chunk_once(published, got)
    assert seen["pack"] == 2 and seen["ranges"][0] is None and seen["ranges"][1].startswith("bytes=")
    assert 0 < int(seen["ranges"][1][6:-1]) <= len(published["pack"]) // 2 and client.resumed == 1
    assert client.bytes_downloaded == len(published["pack"])  # nothing that arrived was fetched twice


def test_from_a_chunk_that_fails_its_digest_on_each_chunk_is_fetched_on_its_own(published, store, tmp_path):
    got, seen, _ = _pack_through(published, store, "damage", tmp_path)
    _assert_every_chunk_once(published, got)
    assert seen["pack"] == 1 and seen["chunks"] == len(published["manifest"].pack()) - 2  # the first two came


def test_what_a_store_sends_past_the_pack_is_not_read(published, store, tmp_path):
    got, seen, client = _pack_through(published, store, "extra", tmp_path)
    _assert_every_chunk_once(published, got)
    assert seen["pack"] == 1 and seen["chunks"] == 0 and client.bytes_downloaded < len(published["pack"]) + (1 << 20)


def test_a_store_without_the_pack_is_asked_chunk_by_chunk_for_the_same_patch(published, store, tmp_path):
    """build_patch through a store that knows no pack equals build_patch through one that does."""
    m: Manifest = published["manifest"]

    async def build(url: str, out: Path):
        async with aiohttp.ClientSession() as s:
            client = StoreClient(url, s, tmp_path / "dl", token=STORE_TOKEN)
            with ThreadPoolExecutor(2) as pool:
                return await inplace.build_patch(client, m, published["v0"], pool, out)

    async def via_old():
        runner, url, seen = await _proxy(store, "old")
        try:
            return await build(url, tmp_path / "old.safetensors"), seen
        finally:
            await runner.cleanup()

    patch = asyncio.run(build(store, tmp_path / "new.safetensors"))
    old, seen = asyncio.run(via_old())
    assert seen["pack"] == 1 and seen["chunks"] == len(m.pack())
    a, b = load_file(str(patch.path)), load_file(str(old.path))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert patch.sparse_elems == old.sparse_elems > 0


def test_a_pack_from_a_store_that_is_gone_is_a_fetch_error(published, tmp_path):
    async def main():
        async with aiohttp.ClientSession() as s:
            client = StoreClient(f"http://127.0.0.1:{free_port()}", s, tmp_path / "dl", retries=2)
            await client.pack(1, published["manifest"].pack(), lambda *a: None)

    with pytest.raises(FetchError) as e:
        asyncio.run(main())
    assert not isinstance(e.value, PackUnsupported)  # a store that is gone is not a store without the pack


def test_the_patch_is_decoded_into_its_file_as_the_patch_writer_lays_it_out(published, store, tmp_path):
    """build_patch lays the file out first and decodes into it: the same file as PatchWriter makes of the changes
    (positions, XORs, the base's bits at the first of them) and the manifest's changed counts."""
    from safetensors import safe_open

    from weight_patch import writer as patch_writer
    from weight_sync.checkpoint import CheckpointReader

    m: Manifest = published["manifest"]

    async def build():
        async with aiohttp.ClientSession() as s:
            client = StoreClient(store, s, tmp_path / "dl", token=STORE_TOKEN)
            with ThreadPoolExecutor(2) as pool:
                return await inplace.build_patch(client, m, published["v0"], pool, tmp_path / "p.safetensors")

    patch = asyncio.run(build())
    want = patch_writer.PatchWriter()
    with CheckpointReader(published["v0"]) as v0, CheckpointReader(published["v1"]) as v1:
        for t in m.changed_tensors():
            e = m.tensors[t]
            base, new = v0.bits(e.name), v1.bits(e.name)
            idx = np.flatnonzero(base != new).astype(patch_writer.index_dtype(e.numel))
            assert idx.size == sum(c.changed for c in e.chunks) > 0
            want.sparse(e.name, e.dtype, e.shape, idx, base[idx] ^ new[idx], base)
    want.write(tmp_path / "want.safetensors")
    with safe_open(str(patch.path), "numpy") as a, safe_open(str(tmp_path / "want.safetensors"), "numpy") as b:
        assert a.metadata() == b.metadata() and set(a.keys()) == set(b.keys())
        assert all(np.array_equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    assert patch.bytes == patch.path.stat().st_size and patch.files.keys() == m.files.keys()


def test_a_patch_whose_store_is_gone_leaves_no_file(published, tmp_path):
    """The file is laid out before anything arrives; a fetch that fails removes it."""

    async def main():
        async with aiohttp.ClientSession() as s:
            client = StoreClient(f"http://127.0.0.1:{free_port()}", s, tmp_path / "dl", retries=2, token=STORE_TOKEN)
            with ThreadPoolExecutor(2) as pool:
                await inplace.build_patch(
                    client, published["manifest"], published["v0"], pool, tmp_path / "p.safetensors"
                )

    with pytest.raises(FetchError):
        asyncio.run(main())
    assert not (tmp_path / "p.safetensors").exists()
