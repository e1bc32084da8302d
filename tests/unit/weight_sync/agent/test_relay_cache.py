"""An agent's relay cache (weight_sync.agent.relay.RelayCache): what a peer asking for a piece still arriving sees."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from weight_sync.agent.relay import RelayCache, RelayConfig


def _receive_in_thread(cache: RelayCache, piece: str, data: bytes | None, after_s: float) -> threading.Thread:
    started = threading.Event()

    def run():
        with cache.receiving(1, piece):
            started.set()
            time.sleep(after_s)
            if data is not None:
                cache.put(1, piece, data)

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    return t


def test_a_piece_arriving_wakes_its_waiters_at_once(tmp_path):
    cache = RelayCache(tmp_path)
    t = _receive_in_thread(cache, "chunks/0.0", b"abc", 0.3)
    t0 = time.monotonic()
    assert asyncio.run(cache.arrival(1, "chunks/0.0", 10.0))
    assert time.monotonic() - t0 < 2.0 and cache.path(1, "chunks/0.0").read_bytes() == b"abc"
    t.join()


def test_a_failed_or_slow_or_unknown_piece_is_refused(tmp_path):
    cache = RelayCache(tmp_path)
    t = _receive_in_thread(cache, "chunks/0.1", None, 0.2)  # the fetch fails: nothing put
    t0 = time.monotonic()
    assert not asyncio.run(cache.arrival(1, "chunks/0.1", 10.0))
    assert time.monotonic() - t0 < 2.0
    t.join()
    t = _receive_in_thread(cache, "chunks/0.2", b"x", 1.0)
    assert not asyncio.run(cache.arrival(1, "chunks/0.2", 0.1))  # bounded wait
    t.join()
    assert not cache._waiters, "a waiter that gave up is forgotten"
    assert not asyncio.run(cache.arrival(1, "chunks/9.9", 10.0))  # not on its way: refused at once


def test_pieces_stay_inside_the_cache_and_prune_with_versions(tmp_path):
    cache = RelayCache(tmp_path / "relay")
    for bad in ("../x", "chunks/../../x", "files/..", "chunks/1", "files/a/b"):
        with pytest.raises(ValueError):
            cache.path(1, bad)
    for v in (1, 2, 3):
        cache.put(v, "manifest.json", b"{}")
    cache.prune({2, 3})
    assert cache.versions() == [2, 3]


def test_relay_config_needs_an_address_peers_can_use():
    with pytest.raises(ValueError):
        RelayConfig(root=None, port=8200, host="0.0.0.0")
    with pytest.raises(ValueError):
        RelayConfig(root=None, port=0)
    for url in ("http://198.18.0.2:8200/relay", "ftp://198.18.0.2:8200", "http://198.18.0.2:99999"):
        with pytest.raises(ValueError):  # the store would refuse it on every piece: refused at start instead
            RelayConfig(root=None, port=8200, url=url)
    assert RelayConfig(root=None, port=8200, host="0.0.0.0", url="http://198.18.0.2:8200/").advertised == (
        "http://198.18.0.2:8200"
    )
