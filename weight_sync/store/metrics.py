"""The weight store's per-version sizes on its /metrics: each delta's bytes on the wire and the raw bytes it
stands for (their ratio is the compression the DESIGN's delta sync is judged by). Read from the signed
manifests at scrape time; a manifest never changes once published, so each is read once."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


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
