"""The version store: the directory of published versions and its HTTP face (server), its ledgers, the store on S3, its
metrics, and the peer relay's tracker and redirects.

- `ledger`: The store's append-only ledgers (activations.jsonl, announcements.jsonl): one JSON record a line.
- `metrics`: The weight store's /metrics read from what it holds: each version's size (a delta's bytes on the wire
  and the raw bytes it stands for) and the eval gate's verdicts (blocked versions, counts, seconds per version).
- `rebuild`: A published version as a checkpoint directory again, rebuilt from a local store directory and checked
  against its signed manifest (what the eval gate loads).
- `relay`: The store server's side of the peer relay: answer a piece request with its bytes or a redirect to a peer
  (weight_sync.store.tracker decides), count every byte the store sends, and show both (/metrics, /stats).
- `s3`: The weight store on S3: the publisher's side (upload a version, list, retention) and the connection both
  sides share.
- `server`: The version store: a directory of published versions, and its HTTP face.
- `tracker`: Who holds which piece of which version: the store's answer to "where should this agent fetch from?".
"""
