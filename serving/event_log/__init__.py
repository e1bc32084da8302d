"""The event log off the request path: the gateway builds each completion's event (completion) and submits every
event to an on-disk spool (sink, spool, spool_writer, sync_window, writer_queue), a child process ships the spool
to Kafka (shipper) after scanning its text for secrets (scan, secret_scrub, secret_prefilter, secret_patterns), and
a tenant's records can be forgotten before they leave (forget).

- `completion`: The completion event (contracts.events.CompletionEvent) built from what the gateway knows once a
  choice is served: the request, the replica's result, who asked, and where it was routed; with the meta the spool
  keeps beside it (the tenant, the time, the texts the shipper scans for secrets).
- `forget`: The spool's side of forgetting a tenant (`flywheel tenants forget`): which records are forgotten, the
  file that says so, and the redaction of what is still on disk.
- `pipeline`: Lossless event logging off the request path: an on-disk spool in front of an idempotent Kafka
  producer.
- `scan`: What the shipper (serving.event_log.shipper) does to an event's content before it leaves the gateway: the
  secret scan of the texts its meta carries (serving.event_log.secret_scrub), the withheld value that replaces an
  event with a finding, a failed scan or none at all (failing closed), and the backlog past which it withholds
  without scanning.
- `secret_patterns`: The detector's own regexes as Hyperscan patterns that match at least wherever they do, over
  ASCII lines (the first pass of serving.event_log.secret_scrub: serving.event_log.secret_prefilter compiles
  these).
- `secret_prefilter`: The first pass of the secret scan (serving.event_log.secret_scrub): the lines of an event's
  texts that some plugin could flag, each with the plugins that could, found by one Hyperscan scan of all the texts
  at once.
- `secret_scrub`: Secrets in event texts, found before an event leaves the gateway (the shipper calls this:
  serving.event_log.shipper).
- `shipper`: The shipper: a child process that delivers the spool to Kafka, so kafka-python never holds the
  gateway's GIL.
- `sink`: The gateway's side of the event log: submit an event, and wait (boundedly) until it is spooled.
- `spool`: The on-disk event spool: numbered segment files of CRC-framed msgpack records, and a delivery cursor.
- `spool_writer`: Appending to the spool's head segment: one open descriptor, one write per batch, and an
  fdatasync per batch (strict) or per sync window.
- `sync_window`: The spool's durability window: who syncs what was written, when, and how long records waited.
- `writer_queue`: The spool writer thread's queue: events for it to write, and cues (WAKE) that a write of the
  request path's own opened a group the next sync owes (serving.event_log.pipeline).
"""
