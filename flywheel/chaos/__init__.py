"""`flywheel chaos`: the whole loop under faults, and the audit afterwards that nothing was lost, trained twice or left
running.

- `audit`: Audits after a fault drill (the chaos run, the fleet drill): what reached Kafka (every record of a topic
  from the start, duplicates by event_id dropped, as the trainer drops them) and what the trainer trained (its
  checkpoints' ledgers).
- `faults`: the faults the run injects (kills, disks full, outages): what each does to the running fleet and how it
  is undone, and the tmpfs mounts the disk-full faults fill.
- `run`: `flywheel chaos`: the fleet and the trainer set up, the faults injected at seeded moments, then a check that
  nothing was lost, trained twice, left stuck or left running, and the report.
"""
