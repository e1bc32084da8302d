"""The store's tracker (weight_sync.store.tracker): who an agent is sent to for a piece, and what it forgets."""

from __future__ import annotations

import pytest

from weight_sync.store.relay import peer_url
from weight_sync.store.server import valid_piece
from weight_sync.store.tracker import Tracker, TrackerConfig

A, B, C, D, E, F, G = (f"http://198.18.0.{i}:8200" for i in range(1, 8))


def test_the_first_asker_gets_the_store_then_a_tree_of_the_fanout():
    t = Tracker(TrackerConfig(fanout=2))
    sources = {peer: t.choose(1, "chunks/0.0", peer) for peer in (A, B, C, D, E, F, G)}
    assert sources == {A: None, B: A, C: A, D: B, E: B, F: C, G: C}  # heap order: depth log2(n)
    assert t.redirects == 6


def test_fanout_zero_means_the_store_serves_everyone():
    t = Tracker(TrackerConfig(fanout=0))
    assert [t.choose(1, "manifest.json", p) for p in (A, B, C)] == [None, None, None]


def test_pieces_spread_independently():
    t = Tracker(TrackerConfig(fanout=1))
    assert t.choose(1, "chunks/0.0", A) is None
    assert t.choose(1, "chunks/0.1", B) is None  # B is the root of this piece's tree
    assert t.choose(1, "chunks/0.1", A) == B
    assert t.choose(2, "chunks/0.0", B) is None  # another version: nobody holds it yet


def test_an_agent_is_never_sent_to_itself_and_asking_again_puts_it_last():
    t = Tracker(TrackerConfig(fanout=2))
    assert t.choose(1, "chunks/0.0", A) is None
    assert t.choose(1, "chunks/0.0", A) is None  # alone: the store again (it lost the piece, or retries)
    assert t.choose(1, "chunks/0.0", B) == A
    assert t.choose(1, "chunks/0.0", A) == B  # A asked again: it no longer counts as holding it
    assert list(t.pieces[(1, "chunks/0.0")]) == [B, A]


def test_a_failed_holder_is_dropped_from_every_piece_of_the_version():
    t = Tracker(TrackerConfig(fanout=2))
    for piece in ("manifest.json", "chunks/0.0", "files/config.json"):
        t.choose(1, piece, A)
    t.choose(2, "chunks/0.0", A)
    assert t.drop(1, A) == 3
    assert t.choose(1, "chunks/0.0", B) is None  # the store serves B: A is gone
    assert t.choose(2, "chunks/0.0", B) == A  # other versions keep it
    t.record(1, "chunks/0.0", C)  # served directly (a fallback): a holder from now on
    assert t.choose(1, "chunks/0.0", D) == B and t.choose(1, "chunks/0.0", E) == B
    assert t.choose(1, "chunks/0.0", F) == C


def test_memory_is_bounded():
    t = Tracker(TrackerConfig(fanout=2, max_pieces=100, max_holders=4))
    for v in range(3):
        for c in range(100):
            for p in (A, B, C, D, E, F, G):
                t.choose(v, f"chunks/0.{c}", p)
    assert len(t.pieces) == 100 and {v for v, _ in t.pieces} == {2}  # the oldest forgotten first
    assert all(len(h) <= 4 for h in t.pieces.values())
    t.retain({0, 1})  # version 2 deleted from the store
    assert not t.pieces and 2 not in t.known


def test_config_is_checked():
    with pytest.raises(ValueError):
        TrackerConfig(fanout=-1)
    with pytest.raises(ValueError):
        TrackerConfig(max_pieces=0)


@pytest.mark.parametrize(
    "raw, ok",
    [
        ("http://198.18.0.1:8200", "http://198.18.0.1:8200"),
        ("http://198.18.0.1:8200/", "http://198.18.0.1:8200"),
        ("https://relay.example:443", "https://relay.example:443"),
        ("ftp://198.18.0.1:8200", None),
        ("http://198.18.0.1:8200/x", None),
        ("http://198.18.0.1:8200?a=1", None),
        ("http://u:p@198.18.0.1:8200", None),
        ("http://198.18.0.1:99999", None),
        ("198.18.0.1:8200", None),
        ("http://" + "a" * 300, None),
    ],
)
def test_peer_urls_are_checked(raw, ok):
    if ok is None:
        with pytest.raises(ValueError):
            peer_url(raw)
    else:
        assert peer_url(raw) == ok


@pytest.mark.parametrize(
    "piece, ok",
    [
        ("manifest.json", True),
        ("manifest.sig", True),
        ("chunks/3.12", True),
        ("files/tokenizer.json", True),
        ("chunks/../x", False),
        ("chunks/3.12\n", False),
        ("files/..", False),
        ("files/a/b", False),
        ("files/", False),
        ("head/model.safetensors", False),
        ("../manifest.json", False),
    ],
)
def test_only_pieces_of_a_version_are_served(piece, ok):
    assert valid_piece(piece) is ok
