"""What an SRE sees (`flywheel observe`): a real Prometheus scraping the fleet, the alert rules and their runbooks, and
the Grafana dashboard.

- `alert_rules`: The repo's Prometheus alert rules (deploy/prometheus/alerts.yml) and their runbooks
  (docs/runbooks/), as data.
- `command`: `flywheel observe`: a Prometheus (flywheel.observe.prometheus) scraping a running fleet until Ctrl-C,
  and the check the demo makes at its end: its per-version table against PromQL over the gateway's per-version
  series.
- `dashboard`: The Grafana dashboard that ships in deploy/grafana/, and its PromQL as Prometheus can run it.
- `prometheus`: A real Prometheus scraping a fleet: `flywheel observe`, and inside `flywheel demo` and `flywheel
  loadtest`.
"""
