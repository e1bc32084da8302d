"""An in-place patch the engine's loader refused is a refused load, whatever SGLang's HTTP status: when a
request still running kept the prefix cache, SGLang answers 400 "cache was not flushed" after putting the new
version's label on the weights; the switch must put the label back and report the load refused (the agent then
reloads the version from disk), not flush the cache and call base weights the new version."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import serving_app
from weight_patch import format as weight_patch
from weight_sync.agent.switch import InPlace, LoadRefused, _load, switch

UNFLUSHED = (
    "Weights were updated, but the cache was not flushed because requests are still running or waiting; "
    "flush it after they finish"
)


class PatchEngine:
    """SGLang's weight-update endpoints as they answer for a patch whose loader ran (its outcome in the result
    file, as weight_patch.format's loader writes it): `loader_ok` and whether a request kept the cache."""

    def __init__(self, loader_ok: bool, unflushed: bool, written: int = 0):
        self.loader_ok, self.unflushed, self.written = loader_ok, unflushed, written
        self.label, self.calls, self.reloads = "4", [], []

    def app(self) -> web.Application:
        app = web.Application()
        for name in ("begin_weight_update", "end_weight_update", "update_weights_from_tensor"):
            app.router.add_post(f"/{name}", self.handle)
        app.router.add_post("/update_weight_version", self.relabel)
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_post("/update_weights_from_disk", self.reload)
        return app

    async def reload(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append("update_weights_from_disk")
        self.reloads.append(body["model_path"])
        self.label = body["weight_version"]
        return web.json_response({"success": True})

    async def handle(self, request: web.Request) -> web.Response:
        name = request.path.strip("/")
        self.calls.append(name)
        if name != "update_weights_from_tensor":
            return web.json_response({"success": True})
        body = await request.json()
        error = None if self.loader_ok else "x"
        weight_patch.write_result(self.patch_path, {"ok": self.loader_ok, "written": self.written, "error": error})
        self.label = body["weight_version"]  # SGLang labels the weights whatever the loader did
        if self.unflushed:
            return web.json_response({"success": False, "message": UNFLUSHED}, status=400)
        return web.json_response({"success": True})

    async def relabel(self, request: web.Request) -> web.Response:
        self.calls.append("update_weight_version")
        self.label = (await request.json())["new_version"]
        return web.json_response({"success": True})

    async def flush(self, request: web.Request) -> web.Response:
        self.calls.append("flush_cache")
        return web.json_response({"success": True})


async def _apply(engine: PatchEngine, tmp_path, restore_dir: str | None = None):
    engine.patch_path = str(tmp_path / "v5.safetensors")
    async with serving_app(engine.app()) as url, aiohttp.ClientSession() as session:
        if restore_dir is None:
            return await _load(session, url, None, 5, InPlace(engine.patch_path, base_version=4))
        patch = InPlace(engine.patch_path, base_version=4)
        return await switch(url, None, 5, "no_pause", patch=patch, restore_dir=restore_dir)


@pytest.mark.parametrize("unflushed", [False, True])
def test_a_refused_patch_puts_the_label_back_whatever_the_status(tmp_path, unflushed):
    engine = PatchEngine(loader_ok=False, unflushed=unflushed)
    with pytest.raises(LoadRefused, match="refused the patch"):
        asyncio.run(_apply(engine, tmp_path))
    assert engine.label == "4"  # the base's label: those are the weights it serves
    assert "flush_cache" not in engine.calls  # before: flushed, then reported a switch to v5


def test_an_applied_patch_with_a_request_running_is_flushed_and_labelled(tmp_path):
    engine = PatchEngine(loader_ok=True, unflushed=True)
    _, result = asyncio.run(_apply(engine, tmp_path))
    assert result["ok"] and engine.label == "5" and engine.calls[-1] == "flush_cache"


@pytest.mark.parametrize("written", [0, 3])
def test_a_patch_refused_half_written_reloads_the_base_before_users_see_it(tmp_path, written):
    """The loader failed after writing 3 tensors: the weights are neither version, so the switch reloads the
    base from disk before it lets requests through (before: the drain ended on mixed weights while the agent
    rebuilt the version). Nothing written: nothing to reload."""
    engine = PatchEngine(loader_ok=False, unflushed=False, written=written)
    with pytest.raises(LoadRefused) as e:
        asyncio.run(_apply(engine, tmp_path, restore_dir="/models/v4"))
    assert e.value.partial == bool(written) and engine.label == "4"
    assert engine.reloads == (["/models/v4"] if written else [])
