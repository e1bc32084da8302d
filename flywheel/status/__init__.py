"""`flywheel status`, the SRE's one screen: gathered from the running fleet (gather, sources, kafka_lag) and drawn
(screen).

- `gather`: `flywheel status`, the gathering half: one dict of everything an SRE looks at first, read from the
  running fleet (the rendering and the command are flywheel.status.screen).
- `kafka_lag`: `flywheel status`: consumer lag of the trainer's and the weight agents' Kafka groups
  (flywheel.status.gather).
- `screen`: `flywheel status`: the SRE's one screen (flywheel.status.gather gathers it, this module draws it with
  rich).
- `sources`: `flywheel status`: reading its sources (flywheel.status.gather): HTTP GETs whose every failure becomes
  one line (Unexpected, its message from explain()), the gateway's admin API, and Prometheus text pages.
"""
