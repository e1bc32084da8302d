"""The provenance of published versions (online_rl.data.provenance): which tenants' samples each version saw, per
version and cumulative, distilled samples apart, damaged or missing records unknown for every tenant, a publish not
yet confirmed reconciled into its version, and a failure to record never failing the publish. (What the tenant gate
refuses and drops: tests/unit/online_rl/data/test_tenant_gate.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from online_rl.data import provenance
from online_rl.data.provenance import COUNTS


def test_provenance_counts_per_version_and_cumulative(tmp_path):
    assert provenance.read_all(tmp_path) == [] and provenance.versions_for(tmp_path, {"a"}) == []
    provenance.write(tmp_path, 0, 0, {})  # the base model
    provenance.write(tmp_path, 1, 4, {"a": 3, "b": 1}, published=100.0)
    provenance.write(tmp_path, 2, 9, {"a": 3, "b": 6})  # a was forgotten: no more of its samples
    provenance.write(tmp_path, 10, 12, {"a": 3, "b": 8, "c": 2})  # versions sort as numbers
    records = provenance.read_all(tmp_path)
    assert [r["version"] for r in records] == [0, 1, 2, 10]
    assert records[0]["tenants"] == {} and records[0]["tenants_total"] == {}
    assert records[1] == {
        "version": 1,
        "step": 4,
        "published": 100.0,
        "tenants": {"a": 3, "b": 1},
        "tenants_total": {"a": 3, "b": 1},
        "distilled": {},
        "distilled_total": {},
    }
    assert records[2]["tenants"] == {"b": 5} and records[2]["tenants_total"] == {"a": 3, "b": 6}
    assert records[3]["tenants"] == {"b": 2, "c": 2}
    found = provenance.versions_for(tmp_path, {"a"})
    assert [r["version"] for r in found if r.get("unknown")] == list(range(3, 10))  # published, no records here
    found = [r for r in found if not r.get("unknown")]
    assert set(found[0]) == {"version", "step", "published", *COUNTS}
    assert [(r["version"], r["tenants"], r["tenants_total"]) for r in found] == [
        (1, {"a": 3}, {"a": 3}),
        (2, {"a": 0}, {"a": 3}),  # weights are not un-trained: every later version saw a's samples too
        (10, {"a": 0}, {"a": 3}),
    ]
    assert [r["version"] for r in provenance.versions_for(tmp_path, {"c", "nobody"}) if "unknown" not in r] == [10]
    assert not list((tmp_path / "provenance").glob("*.tmp"))


def test_distilled_samples_are_counted_apart_and_list_a_version(tmp_path):
    provenance.write(tmp_path, 1, 2, {"a": 2}, distilled={"a": 4})
    provenance.write(tmp_path, 2, 5, {"a": 2, "b": 1}, distilled={"a": 4, "c": 3})  # c: only distilled samples
    r = provenance.read_all(tmp_path)[1]
    assert (r["tenants"], r["distilled"], r["distilled_total"]) == ({"b": 1}, {"c": 3}, {"a": 4, "c": 3})
    [v2] = provenance.versions_for(tmp_path, {"c"})
    assert (v2["version"], v2["tenants"], v2["tenants_total"], v2["distilled"], v2["distilled_total"]) == (
        2,
        {},
        {},
        {"c": 3},
        {"c": 3},
    )
    found = provenance.versions_for(tmp_path, {"a"})
    assert [(r["tenants"], r["distilled"]) for r in found] == [({"a": 2}, {"a": 4}), ({"a": 0}, {"a": 0})]


def test_damaged_or_missing_records_are_unknown_for_every_tenant(tmp_path):
    provenance.write(tmp_path, 0, 0, {})
    provenance.write(tmp_path, 1, 4, {"a": 3})
    provenance.write(tmp_path, 2, 6, {"a": 3})
    provenance.write(tmp_path, 4, 9, {"a": 3, "b": 2})  # v3: no record
    (tmp_path / "provenance" / "v2.json").write_text('{"version": 2, "tenan')  # damaged
    (tmp_path / "provenance" / "v0.json").write_text("[]")  # the base model: never listed
    records = provenance.read_all(tmp_path)
    assert [(r["version"], r.get("unknown", False)) for r in records] == [(0, True), (1, False), (2, True), (4, False)]
    assert records[2]["why"].startswith("damaged record") and records[2]["tenants_total"] == {}
    # a new record counts from the newest usable one before it
    assert provenance.write(tmp_path, 5, 10, {"a": 4, "b": 2})["tenants"] == {"a": 1}
    marker = tmp_path / "published" / "step-00000012" / "PUBLISHED"  # v6 published, its record lost
    marker.parent.mkdir(parents=True)
    marker.write_text("6")

    def shape(found):
        return [(r["version"], r["step"], r.get("unknown", False), r["tenants_total"]) for r in found]

    assert shape(provenance.versions_for(tmp_path, {"nobody"})) == [
        (2, None, True, {}),
        (3, None, True, {}),
        (6, 12, True, {}),
    ]
    found = provenance.versions_for(tmp_path, {"a"})
    assert shape(found) == [
        (1, 4, False, {"a": 3}),
        (2, None, True, {}),
        (3, None, True, {}),
        (4, 9, False, {"a": 3}),
        (5, 10, False, {"a": 4}),
        (6, 12, True, {}),
    ]
    assert all(set(COUNTS) <= set(r) and "published" in r for r in found)
    assert found[1]["why"].startswith("damaged") and found[2]["why"] == "no provenance record"
    assert found[5]["published"] == marker.stat().st_mtime and found[1]["published"] is None


def test_a_publish_not_yet_confirmed_is_listed_and_reconciled_into_its_version(tmp_path):
    assert provenance.reconcile(tmp_path, [0, 1, 2]) == []  # a new work directory: the store's are not its own
    assert not (tmp_path / "provenance").exists()
    provenance.write(tmp_path, 0, 0, {})
    provenance.write(tmp_path, 1, 4, {"a": 3})
    provenance.write_pending(tmp_path, 8, {"a": 5, "b": 1}, {"b": 2}, after=1)  # then the commit of v2: a crash
    [v2] = provenance.versions_for(tmp_path, {"b"})
    assert (v2["version"], v2["step"], v2["published"], v2["unknown"]) == (2, 8, None, True)
    assert (v2["tenants"], v2["tenants_total"], v2["distilled_total"]) == ({"b": 1}, {"b": 1}, {"b": 2})
    assert [r["tenants"] for r in provenance.versions_for(tmp_path, {"a"})] == [{"a": 3}, {"a": 2}]
    assert provenance.versions_for(tmp_path, {"nobody"}) == []
    # the next publish (or start): v2 takes the pending totals; v3, committed without any, is unknown
    assert provenance.reconcile(tmp_path, [0, 1, 2, 3], lambda v: 1000.0 + v) == [(2, 8), (3, None)]
    assert not (tmp_path / "provenance" / "pending.json").exists()
    r2, r3 = provenance.read_all(tmp_path)[2:]
    assert (r2["step"], r2["published"], r2["tenants"], r2["distilled"]) == (8, 1002.0, {"a": 2, "b": 1}, {"b": 2})
    assert r3["unknown"] and r3["published"] == 1003.0
    assert [(r["version"], r.get("unknown", False)) for r in provenance.versions_for(tmp_path, {"b"})] == [
        (2, False),
        (3, True),
    ]
    assert provenance.reconcile(tmp_path, [0, 1, 2, 3]) == []
    (tmp_path / "provenance" / "pending.json").write_text("{")  # damaged: reported, no entry
    assert provenance.read_pending(tmp_path) is None


def test_a_provenance_failure_after_the_commit_never_fails_the_publish(tmp_path, monkeypatch):
    """Any error writing a version's record after the store has it is counted, and the version is returned (a
    failed publish is retried: a second version of the same weights); the next publish records it."""
    from prometheus_client import CollectorRegistry, Counter

    import weight_sync.publish as wp
    from online_rl.config import PublisherConfig
    from online_rl.trainer import publisher as pub
    from online_rl.trainer.failures import Failures
    from weight_sync.store.server import Store

    def fake_publish(checkpoint, cfg, announce_now=True, **_):
        latest = Store(cfg.store).latest()
        version = 0 if latest is None else latest + 1
        Store(cfg.store).version_dir(version).mkdir()
        return SimpleNamespace(version=version, announcement={"version": version}, kind="full", ratio=1.0)

    monkeypatch.setattr(wp, "publish", fake_publish)
    monkeypatch.setattr(wp, "announce", lambda *a, **k: None)
    monkeypatch.setattr(pub, "save_streaming", lambda model, out, dtype: out.mkdir(parents=True))
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    counter = Counter("f", "f", ["stage", "cause"], registry=CollectorRegistry())
    failures = Failures(counter)
    p = pub.Publisher(PublisherConfig(store=tmp_path / "store"), base, tmp_path / "work", failures)
    work = tmp_path / "work"
    assert p.publish(None, 3, {}, {"a": 2}) == 1
    real_write = provenance.write

    def damaged(*a, **k):
        raise json.JSONDecodeError("damaged", "{", 0)  # not an OSError

    monkeypatch.setattr(provenance, "write", damaged)
    assert p.publish(None, 7, {}, {"a": 5}, {"a": 1}) == 2
    assert failures.count("provenance") == 1 and Store(tmp_path / "store").versions() == [0, 1, 2]
    assert (work / "published" / "step-00000007" / "PUBLISHED").read_text() == "2"
    [v1, v2] = provenance.versions_for(work, {"a"})  # its totals, written before, and its marker confirm it
    assert v2["version"] == 2 and v2["step"] == 7 and "unknown" not in v2 and v2["published"] is not None
    assert (v2["tenants"], v2["tenants_total"], v2["distilled"]) == ({"a": 3}, {"a": 5}, {"a": 1})
    (work / "published" / "step-00000007" / "PUBLISHED").unlink()  # without the marker: not confirmed
    [_, v2] = provenance.versions_for(work, {"a"})
    assert v2["unknown"] and v2["published"] is None and v2["tenants"] == {"a": 3}
    monkeypatch.setattr(provenance, "write", real_write)
    # a restart: the publisher records v2 from the totals written before its commit
    again = pub.Publisher(PublisherConfig(store=tmp_path / "store"), base, work, failures)
    assert [(r["version"], r["step"], r.get("unknown", False)) for r in provenance.versions_for(work, {"a"})] == [
        (1, 3, False),
        (2, 7, False),
    ]
    assert (work / "published" / "step-00000007" / "PUBLISHED").read_text() == "2"  # resumed(): not again
    assert again.publish(None, 9, {}, {"a": 5, "b": 1}, {"a": 1}) == 3
    assert [r["version"] for r in provenance.read_all(work)] == [0, 1, 2, 3]
    assert not (work / "provenance" / "pending.json").exists()
    # no record written before the commit, no version: the publish fails and nothing is in the store
    monkeypatch.setattr(provenance, "write_pending", damaged)
    with pytest.raises(json.JSONDecodeError):
        again.publish(None, 10, {}, {"a": 5})
    assert Store(tmp_path / "store").versions() == [0, 1, 2, 3]
