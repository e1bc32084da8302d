"""`flywheel status`, the SRE's one screen: gathered from the running fleet (gather, sources, kafka_lag) and drawn
(panels, screen).

- `gather`: `flywheel status`, the gathering half: one dict of everything an SRE looks at first, read from the
  running fleet (the rendering and the command are flywheel.status.screen).
- `kafka_lag`: `flywheel status`: consumer lag of the trainer's and the weight agents' Kafka groups
  (flywheel.status.gather).
- `panels`: `flywheel status`: the screen's parts, each drawn from its gathered dict as a rich table (replicas,
  gateway, kafka, trainer, versions, canary, alerts), and the number formats they share.
- `screen`: `flywheel status`: the SRE's one screen and the command (flywheel.status.gather gathers it,
  flywheel.status.panels draws each part, this module puts them together, once or every --watch seconds).
- `sources`: `flywheel status`: reading its sources (flywheel.status.gather): HTTP GETs whose every failure becomes
  one line (Unexpected, its message from explain()), the gateway's admin API, and Prometheus text pages.
"""
