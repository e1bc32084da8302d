"""The weight store's /metrics read from what it holds: each version's size (VersionSizes: a delta's bytes on the
wire and the raw bytes it stands for, whose ratio is the compression the DESIGN's delta sync is judged by; read from
the signed manifests, each once, as a manifest never changes) and the eval gate's verdicts (GateVerdicts: read from
the activations ledger at scrape time)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class VersionSizes:
    def __init__(self, store, newest: int = 16):
        self.store = store
        self.newest = newest  # bounded: a long-lived store holds hundreds of versions
        self._sizes: dict[int, tuple[int, int, str]] = {}  # version -> (compressed, raw, kind)

    def collect(self):
        sizes = GaugeMetricFamily(
            "flywheel_store_version_bytes",
            "Bytes of a published version: compressed (its chunks, what agents fetch) and raw (the tensors)",
            labels=["version", "form", "kind"],
        )
        try:
            versions = self.store.versions()[-self.newest :]
        except OSError:  # no versions directory yet: nothing to show, not a failed scrape
            versions = []
        self._sizes = {v: s for v, s in self._sizes.items() if v in versions}  # deleted versions go
        for v in versions:
            if v not in self._sizes:
                try:
                    m = self.store.manifest(v)
                except (OSError, ValueError):  # half-written or damaged: the agents refuse it; so does this
                    continue
                self._sizes[v] = (m.nbytes_compressed, m.nbytes_raw, m.kind)
            compressed, raw, kind = self._sizes[v]
            sizes.add_metric([str(v), "compressed", kind], compressed)
            sizes.add_metric([str(v), "raw", kind], raw)
        yield sizes


class GateVerdicts:
    """The eval gate's verdicts (weight_sync.gate), from the store's activations at scrape time: which versions it
    blocks now (1 until an SRE overrides or a newer version passes), how many verdicts of each kind it has
    recorded, and what the newest judged versions' evaluation cost."""

    def __init__(self, store, newest: int = 16):
        self.store = store
        self.newest = newest

    def collect(self):
        blocked = GaugeMetricFamily(
            "flywheel_gate_blocked",
            "1 while the eval gate blocks this version: no SRE has overridden it and no newer version has passed",
            labels=["version"],
        )
        verdicts = CounterMetricFamily(
            "flywheel_gate_verdicts", "Eval-gate verdicts recorded in the store", labels=["verdict"]
        )
        seconds = GaugeMetricFamily(
            "flywheel_gate_seconds", "Wall seconds the eval gate took to judge a version", labels=["version"]
        )
        counts = dict.fromkeys(("pass", "block", "override"), 0)
        last: dict[int, dict] = {}
        try:
            records = [a for a in self.store.activations() if a.get("type") == "gate"]
        except OSError:
            records = []
        for a in records:
            if a.get("verdict") in counts:
                counts[a["verdict"]] += 1
            if isinstance(a.get("version"), int):
                last[a["version"]] = a
        for verdict, n in counts.items():
            verdicts.add_metric([verdict], n)
        # A newer version through the gate supersedes an older block: the trainer has moved on, no page.
        released = max((v for v, a in last.items() if a.get("verdict") in ("pass", "override")), default=-1)
        for v in sorted(last)[-self.newest :]:
            a = last[v]
            blocked.add_metric([str(v)], 1 if a.get("verdict") == "block" and v > released else 0)
            total = ((a.get("figures") or {}).get("seconds") or {}).get("total")
            if isinstance(total, (int, float)):
                seconds.add_metric([str(v)], total)
        yield blocked
        yield verdicts
        yield seconds
