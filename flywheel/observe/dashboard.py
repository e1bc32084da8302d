"""The Grafana dashboard that ships in deploy/grafana/, and its PromQL as Prometheus can run it.

The dashboard imports as is through Grafana's UI: its `__inputs` ask for the Prometheus data source, which
becomes the `datasource` variable every panel queries (provisioned, the variable is picked on the page
instead). `expressions` lists every query of every panel, rows' nested panels included; `promql_for_query`
replaces Grafana's interval variables so a query can be sent to Prometheus' /api/v1/query
(tests/unit/flywheel/observe/test_grafana_dashboard.py parses them all with promtool; the integration test runs
them against the live Prometheus).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD_FILE = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "flywheel.json"

_VARIABLE = re.compile(r"\$(?:\{__(\w+)\}|__(\w+))")


def load_dashboard(path: str | Path = DASHBOARD_FILE) -> dict:
    return json.loads(Path(path).read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows and the panels nested in collapsed rows included, in order."""
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panels(panel))
    return out


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query target, in dashboard order."""
    return [(p.get("title", ""), t["expr"]) for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def promql_for_query(expr: str, rate_interval: str = "1m", range_: str = "1h") -> str:
    """`expr` with $__rate_interval and $__interval replaced by `rate_interval` and $__range by `range_`
    (also in their ${...} forms). Any other variable is a ValueError: Prometheus could not parse it."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name in ("rate_interval", "interval"):
            return rate_interval
        if name == "range":
            return range_
        raise ValueError(f"unknown Grafana variable ${name} in {expr!r}")

    out = _VARIABLE.sub(sub, expr)
    if "$" in out:
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return out
