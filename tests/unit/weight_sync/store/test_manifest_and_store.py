"""Manifests are signed and validated; the store publishes atomically and keeps what chains need."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from weight_sync import codec
from weight_sync.checkpoint import CheckpointReader, CheckpointWriter
from weight_sync.manifest import (
    Manifest,
    ManifestError,
    TensorEntry,
    generate_key,
    load_private,
    load_public,
    sign,
    verify,
)
from weight_sync.publish import PublishConfig, activate, publish
from weight_sync.store.server import Store


def _entry(name="w", dtype="BF16", shape=(4, 3)):
    bits = np.arange(12, dtype=np.uint16)
    chunks = codec.encode_tensor(bits, None, chunk_elems=5)
    return TensorEntry(
        name=name, dtype=dtype, shape=list(shape), digest=codec.digest(bits), chunks=[m for m, _ in chunks]
    )


@pytest.fixture
def keys(tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    return load_private(tmp_path / "k.pem"), load_public(tmp_path / "k.pub")


def test_signature_round_trip_and_tampering(keys, tmp_path):
    priv, pub = keys
    m = Manifest(version=3, base_version=2, kind="delta", config_digest="c" * 32, tensors=[_entry()])
    body, sig = sign(m, priv)
    assert verify(body, sig, pub).version == 3
    with pytest.raises(ManifestError, match="not signed"):
        verify(body, b"", pub)
    with pytest.raises(ManifestError, match="does not verify"):
        verify(body.replace(b'"version":3', b'"version":4'), sig, pub)
    generate_key(tmp_path / "other.pem", tmp_path / "other.pub")
    with pytest.raises(ManifestError, match="does not verify"):
        verify(body, sig, load_public(tmp_path / "other.pub"))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda m: setattr(m.tensors[0], "name", "../../etc/passwd"), "bad tensor name"),
        (lambda m: setattr(m.tensors[0], "name", "a/b"), "bad tensor name"),
        (lambda m: setattr(m.tensors[0], "dtype", "F8_WEIRD"), "unknown dtype"),
        (lambda m: setattr(m.tensors[0], "shape", [4, 4]), "cover"),
        (lambda m: m.tensors[0].chunks.pop(), "cover"),
        (lambda m: setattr(m, "base_version", 7), "bad base"),
        (lambda m: setattr(m, "kind", "weird"), "bad kind"),
        (lambda m: m.files.update({"../x": "d"}), "bad file name"),
        (lambda m: m.tensors.append(m.tensors[0]), "twice"),
    ],
)
def test_structural_checks(mutate, match):
    m = Manifest(version=3, base_version=2, kind="delta", config_digest="c" * 32, tensors=[_entry()])
    mutate(m)
    with pytest.raises(ManifestError, match=match):
        Manifest.parse(m.canonical())


def test_model_checks():
    m = Manifest(version=1, base_version=0, kind="delta", config_digest="c" * 32, tensors=[_entry()])
    m.check_model({"w": ("BF16", [4, 3])}, "c" * 32)
    with pytest.raises(ManifestError, match="another model config"):
        m.check_model({"w": ("BF16", [4, 3])}, "d" * 32)
    with pytest.raises(ManifestError, match="disagrees"):
        m.check_model({"w": ("BF16", [3, 4])}, "c" * 32)
    with pytest.raises(ManifestError, match="differ"):
        m.check_model({"w": ("BF16", [4, 3]), "v": ("BF16", [1])}, "c" * 32)
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.parse(b'{"schema": "flywheel.manifest.v1"}')


def test_checkpoint_writer_matches_safetensors(tmp_path):
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(7), "c": torch.zeros(0, 4).half()}
    save_file(tensors, str(tmp_path / "ref.safetensors"))
    (tmp_path / "ckpt").mkdir()
    save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"))
    reader = CheckpointReader(tmp_path / "ckpt")
    w = CheckpointWriter(tmp_path / "out.safetensors", [(n, *reader.spec(n)) for n in reader.names()])
    for n in reversed(reader.names()):  # any order
        w.write(n, reader.bits(n))
    w.close()
    back = load_file(str(tmp_path / "out.safetensors"))
    for k, v in tensors.items():
        assert torch.equal(back[k].view(torch.uint8), v.view(torch.uint8)) if v.numel() else back[k].shape == v.shape


def _ckpt(path, seed, base=None, share=0.02):
    import json

    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    if base is None:
        sd = {
            "model.w1": torch.randn(64, 32, generator=g).to(torch.bfloat16),
            "model.w2": torch.randn(100, generator=g),
        }
    else:
        sd = load_file(str(base / "model.safetensors"))
        m = torch.rand(sd["model.w1"].shape, generator=g) < share
        sd["model.w1"] = torch.where(m, sd["model.w1"].view(torch.int16) + 1, sd["model.w1"].view(torch.int16)).view(
            torch.bfloat16
        )
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "hidden_size": 32}))
    return path


def test_publish_chain_retention_and_atomicity(keys, tmp_path):
    from weight_sync.manifest import generate_key

    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem", full_every=3, keep=2)
    prev = _ckpt(tmp_path / "c0", 0)
    kinds = [publish(prev, cfg).kind]
    for v in range(1, 6):
        prev = _ckpt(tmp_path / f"c{v}", v, base=prev)
        kinds.append(publish(prev, cfg).kind)
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta"]
    store = Store(tmp_path / "store")
    assert store.versions() == [3, 4, 5]  # the newest 2, plus the full snapshot their chain needs
    assert store.chain(5) == [3, 4, 5]
    assert not list((tmp_path / "store").glob(".staging-*"))
    with pytest.raises(ValueError, match="not newer"):
        publish(prev, cfg, version=4)
    with pytest.raises(ValueError, match="not in the store"):
        activate(cfg, 1, "too old")
    rec = activate(cfg, 4, "rollback test")
    assert rec["type"] == "activate" and store.activations()[-1]["version"] == 4
    # A staged version is invisible until committed.
    staging = store.staging(6)
    assert 6 not in store.versions() and staging.name.startswith(".staging-6-")


def test_a_publish_is_durable_before_it_is_visible(tmp_path, monkeypatch):
    """Every file of a version (chunks, side files, manifest, signature) and its directories are fsynced
    before the rename that makes it visible (before: only the chunks, so a machine crash could leave a
    visible version with an empty manifest)."""
    import os

    from weight_sync.manifest import generate_key

    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    synced, renamed, fsync, replace = [], [], os.fsync, os.replace

    def record_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fsync(fd)

    def record_replace(src, dst):
        renamed.append((str(src), len(synced)))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    publish(_ckpt(tmp_path / "c0", 0), PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem"))
    staging, before = next((src, n) for src, n in renamed if "/.staging-0-" in src)
    durable = {p[len(staging) + 1 :] for p in synced[:before] if p.startswith(staging)}
    assert {"manifest.json", "manifest.sig", "files/config.json", "chunks", "files"} <= durable, durable
    assert any(p.startswith("chunks/") for p in durable)
    assert staging in synced[:before]  # the staging directory's own entries


def test_agent_follows_versions_rollbacks_and_pins(test_model, tmp_path):
    """The agent's reading of the weights topic (no servers: its decision alone)."""
    from weight_sync.agent.loop import Agent, AgentConfig

    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    agent = Agent(
        AgentConfig(
            name="a",
            replica_url="http://unused",
            store_url="http://unused",
            public_key=tmp_path / "s.pub",
            work_dir=tmp_path / "w",
            initial_model=test_model,
        )
    )
    v = lambda n: {"type": "version", "version": n}  # noqa: E731
    assert agent.decide([v(1), v(2), v(3)]) == 3  # a backlog: only the newest matters
    assert agent.decide([{"type": "activate", "version": 1}]) == 1  # rollback
    assert agent.decide([v(4)]) == 4  # a newer version after a rollback is followed again
    assert agent.decide([{"type": "pin", "version": 2}, v(5)]) == 2  # pinned: new versions wait
    assert agent.decide([{"type": "activate", "version": 3}]) is None
    assert agent.decide([{"type": "unpin"}]) == 5  # unpinned: the newest seen
    # A canary the trial rolled back is never the newest released: an unpin after it returns to the stable one.
    assert agent.decide([{"type": "version", "version": 6, "canary": True}]) is None
    assert agent.decide([{"type": "rollback", "version": 6, "stable": 5}]) == 5
    assert agent.decide([{"type": "pin", "version": 4}]) == 4
    assert agent.decide([{"type": "unpin"}]) == 5  # before: 6, the rolled-back canary, on every replica
    assert agent.decide([v(7), {"type": "version", "version": 8, "canary": True}, {"type": "promote", "version": 8}])
    assert agent.decide([{"type": "pin", "version": 7}, {"type": "unpin"}]) == 8  # a promoted canary is released
    assert agent.decide([{"type": "version"}, {"type": "bogus", "version": 9}]) is None


def _rebuild(store: Store, version: int) -> dict[str, np.ndarray]:
    """A version's tensors from the store alone, through its base chain (what an agent does)."""
    from weight_sync.store.server import chunk_name

    m = store.manifest(version)
    base = _rebuild(store, m.base_version) if m.kind == "delta" else {}
    out = {}
    for t, e in enumerate(m.tensors):
        frames = [
            (c, (store.version_dir(version) / "chunks" / chunk_name(t, i)).read_bytes()) for i, c in enumerate(e.chunks)
        ]
        out[e.name] = codec.decode_tensor(frames, codec.bit_view(e.dtype), e.numel, base.get(e.name))
    return out


def test_delta_after_a_crash_before_head_refresh_names_heads_version(tmp_path):
    """A publisher killed between committing v2 and refreshing head leaves head at v1; the next delta is
    coded against head and must say base v1, so it rebuilds (before: it claimed base v2 and every later
    delta was rejected until the next full snapshot)."""
    import shutil

    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem", full_every=10)
    c0 = _ckpt(tmp_path / "c0", 0)
    c1 = _ckpt(tmp_path / "c1", 1, base=c0)
    publish(c0, cfg)
    publish(c1, cfg)
    head = tmp_path / "store" / "head"
    shutil.copytree(head, tmp_path / "head-at-v1")
    c2 = _ckpt(tmp_path / "c2", 2, base=c1)
    publish(c2, cfg)
    shutil.rmtree(head)
    shutil.copytree(tmp_path / "head-at-v1", head)  # the crash: v2 committed, head still v1
    c3 = _ckpt(tmp_path / "c3", 3, base=c2)
    r = publish(c3, cfg)
    store = Store(tmp_path / "store")
    assert r.kind == "delta" and r.base_version == 1 and store.manifest(3).base_version == 1
    want = load_file(str(c3 / "model.safetensors"))
    got = _rebuild(store, 3)
    for name, t in want.items():
        assert np.array_equal(
            got[name],
            t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().view(got[name].dtype).reshape(-1),
        ), name
    # A head without its version record (an older store) makes the next version a full snapshot.
    (head / "VERSION").unlink()
    assert publish(_ckpt(tmp_path / "c4", 4, base=c3), cfg).kind == "full"


def test_retention_keeps_pinned_and_stable_versions_however_old(tmp_path):
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem", full_every=4, keep=2)
    prev = _ckpt(tmp_path / "c0", 0)
    publish(prev, cfg)
    for v in range(1, 3):
        prev = _ckpt(tmp_path / f"c{v}", v, base=prev)
        publish(prev, cfg)
    activate(cfg, 1, "pinned by an SRE", kind="pin")
    for v in range(3, 10):
        prev = _ckpt(tmp_path / f"c{v}", v, base=prev)
        publish(prev, cfg)
    store = Store(tmp_path / "store")
    assert store.decided() == {1}
    assert {0, 1} <= set(store.versions())  # the pin and the full snapshot it is rebuilt from
    activate(cfg, 1, "unpin", kind="unpin")
    activate(cfg, 8, "rolled back to 8")
    prev = _ckpt(tmp_path / "c10", 10, base=prev)
    publish(prev, cfg)
    assert store.decided() == {8} and 1 not in store.versions() and 8 in store.versions()


def test_unannounced_versions_skip_what_a_later_decision_passed_over(tmp_path):
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem")
    prev = _ckpt(tmp_path / "c0", 0)
    publish(prev, cfg)  # no broker configured: a new store's first version, committed and never announced
    store = Store(tmp_path / "store")
    assert store.announced() == -1 and store.unannounced() == [0]  # before: taken as announced, never sent
    # A store from before the record: nothing is re-announced, its newest is taken as announced.
    (tmp_path / "store" / "announced").unlink()
    assert store.announced() is None and store.unannounced() == [] and store.announced() == 0
    for v in (1, 2):
        prev = _ckpt(tmp_path / f"c{v}", v, base=prev)
        publish(prev, cfg)  # no broker configured: committed, never announced
    assert store.unannounced() == [1, 2]
    store.mark_announced(1)
    store.mark_announced(0)  # never backwards
    assert store.announced() == 1 and store.unannounced() == [2]
    activate(cfg, 1, "rolled back by an SRE")  # after v2 was committed: announcing v2 now would undo it
    assert store.unannounced() == []
    prev = _ckpt(tmp_path / "c3", 3, base=prev)
    publish(prev, cfg)
    assert store.unannounced() == [3]  # committed after the decision
