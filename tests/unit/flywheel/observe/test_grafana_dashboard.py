"""deploy/grafana/flywheel.json: importable as is, every query parses, every metric it reads is exported.

Parsing is promtool's (`check rules` over one recording rule per query); evaluating the queries against a
live Prometheus is the integration test's part (it uses flywheel.observe.dashboard's expressions and
promql_for_query as these tests do).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flywheel.observe.dashboard import DASHBOARD_FILE, expressions, load_dashboard, panels, promql_for_query

REPO = DASHBOARD_FILE.parent.parent.parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SECTIONS = (
    "Traffic",
    "Latency",
    "Acceptance by version",
    "Fleet",
    "Weight switches",
    "Event pipeline",
    "Trainer",
    "Deltas and distribution",
    "Canary (arms by version)",
    "Reward-hacking monitors (by version)",
)
# A metric's constructor and its name: Counter("flywheel_x", ...), Gauge(name="sglang:y", ...), ...
DEFINITION = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|HistogramMetricFamily)"
    r"\(\s*(?:name=)?[\"']([a-zA-Z_:][\w:]*)[\"']"
)
SERIES = {"Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count"), "Summary": ("_sum", "_count")}
KEYWORDS = {"and", "or", "unless", "bool", "offset"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return load_dashboard()


def exported(files) -> set[str]:
    """The series names prometheus_client exposes for the metrics defined in `files`."""
    names = set()
    for path in files:
        for kind, name in DEFINITION.findall(path.read_text(errors="replace")):
            kind = kind.removesuffix("MetricFamily")
            base = name.removesuffix("_total") if kind == "Counter" else name
            names.update(base + suffix for suffix in SERIES.get(kind, ("",)))
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: its identifiers once strings, label matchers, ranges and
    grouping clauses are gone, less functions and aggregations (followed by '(') and operators."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\b\s*(\([^)]*\))?", " ", bare)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", bare)
    return {n for n in names if n not in KEYWORDS}


def test_importable_as_is(dashboard):
    json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["title"] == "Flywheel" and dashboard["uid"]
    assert dashboard["id"] is None and dashboard["schemaVersion"] >= 36
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource" and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    assert var["current"]["value"] == "${DS_PROMETHEUS}"  # the import fills it in; the panels follow it


def test_panels_structure(dashboard):
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = [p["title"] for p in every if p["type"] == "row"]
    assert rows == list(SECTIONS)
    for p in every:
        pos = p["gridPos"]
        assert {"h", "w", "x", "y"} <= pos.keys() and all(isinstance(v, int) for v in pos.values()), p["title"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            assert not p.get("targets")
            continue
        assert p["type"] in ("timeseries", "stat", "table") and p["title"] and p["description"], p
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"] and t["datasource"] == DS, (p["title"], t)


def test_expressions_walk_collapsed_rows(dashboard):
    exprs = expressions(dashboard)
    assert len(exprs) == sum(len(p.get("targets", [])) for p in panels(dashboard))
    (canary,) = [p for p in dashboard["panels"] if p["title"] == "Canary (arms by version)"]
    assert canary["collapsed"] and canary["panels"]
    assert canary["panels"][0]["title"] in {title for title, _ in exprs}


def test_rates_use_rate_interval(dashboard):
    for title, expr in expressions(dashboard):
        for window in re.findall(r"\b(?:rate|irate)\((?:[^()\[]|\{[^}]*\})*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", (title, expr)


def test_promql_for_query():
    assert promql_for_query("rate(x[$__rate_interval]) + increase(x[${__range}])", "30s", "2h") == (
        "rate(x[30s]) + increase(x[2h])"
    )
    assert promql_for_query("rate(x[$__interval])") == "rate(x[1m])"
    with pytest.raises(ValueError):
        promql_for_query('rate(x{replica=~"$replica"}[1m])')


def test_every_expression_parses(dashboard, tmp_path):
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.skip("promtool is not installed (scripts/setup.sh installs it)")
    exprs = expressions(dashboard)
    rules = [{"record": f"dashboard:query_{i}", "expr": promql_for_query(e)} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(rules)} rules found" in out.stdout


def test_every_metric_is_exported(dashboard):
    sources = [p for d in ("serving", "weight_sync", "online_rl", "flywheel") for p in (REPO / d).rglob("*.py")]
    known = exported(sources) | {"up"}
    spec = importlib.util.find_spec("sglang")
    sglang = exported(Path(spec.origin).parent.joinpath("srt").rglob("*.py")) if spec and spec.origin else None
    # As Prometheus stores them: it asks for OpenMetrics, and prometheus_client then escapes the colon of
    # SGLang's "sglang:x" to "sglang_x" (a Prometheus with UTF-8 names, 3.x, would keep the colon).
    sglang = None if sglang is None else {n.replace("sglang:", "sglang_", 1) for n in sglang}
    missing = []
    for title, expr in expressions(dashboard):
        for name in metric_names(expr):
            if name.startswith("sglang_") and sglang is None:
                continue  # SGLang is not installed here: its names cannot be checked
            if name not in (sglang or set()) | known:
                missing.append((title, name))
    assert not missing, f"metrics no component exports: {missing}"
    used = {n for _, e in expressions(dashboard) for n in metric_names(e)}
    assert "flywheel_gateway_version_feedback_total" in used and "sglang_time_to_first_token_seconds_bucket" in used
