"""flywheel.observe.prometheus: the generated configuration, and a real Prometheus scraping real /metrics endpoints
(prometheus_client's own HTTP servers), with a rule that fires, stopped by PID."""

from __future__ import annotations

import time

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from flywheel.observe.prometheus import JOBS, Prometheus, PrometheusConfig, binary_path, scrape_config, target_groups
from infra.procs import free_port, pid_alive

pytestmark = pytest.mark.timeout(120)
needs_prometheus = pytest.mark.skipif(binary_path() is None, reason="prometheus not installed (scripts/setup.sh)")


def test_every_job_reads_its_own_targets_from_the_file(tmp_path):
    cfg = PrometheusConfig(data_dir=tmp_path, rule_files=[])
    conf = scrape_config(cfg, tmp_path / "targets.json")
    assert [j["job_name"] for j in conf["scrape_configs"]] == list(JOBS)
    for job in conf["scrape_configs"]:
        assert job["relabel_configs"] == [{"source_labels": ["__job"], "regex": job["job_name"], "action": "keep"}]
    groups = target_groups({"sglang": [("127.0.0.1:1", {"replica": "r0"})], "gateway": [("127.0.0.1:2", {})]})
    assert groups == [
        {"targets": ["127.0.0.1:1"], "labels": {"__job": "sglang", "replica": "r0"}},
        {"targets": ["127.0.0.1:2"], "labels": {"__job": "gateway"}},
    ]
    with pytest.raises(ValueError, match="unknown scrape jobs"):
        target_groups({"gatway": []})
    with pytest.raises(ValueError, match="positive"):
        PrometheusConfig(data_dir=tmp_path, scrape_interval_s=0)


@needs_prometheus
def test_a_real_prometheus_scrapes_the_targets_it_is_given_and_evaluates_rules(tmp_path):
    servers = []

    def exporter(metric):
        registry = CollectorRegistry()
        m = metric(registry)
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        servers.append(server)
        return m, f"127.0.0.1:{port}"

    requests, gw = exporter(lambda r: Counter("flywheel_gateway_requests", "x", ["route"], registry=r))
    version, agent = exporter(lambda r: Gauge("flywheel_agent_weight_version", "x", registry=r))
    requests.labels("/v1/completions").inc(5)
    version.set(3)
    rules = tmp_path / "rules.yml"
    rules.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "t",
                        "rules": [{"alert": "AgentBehind", "expr": "flywheel_agent_weight_version < 4"}],
                    }
                ]
            }
        )
    )
    cfg = PrometheusConfig(data_dir=tmp_path / "prom", scrape_interval_s=0.5, evaluation_interval_s=0.5)
    cfg.rule_files = [rules]
    prom = Prometheus(cfg)
    try:
        prom.start({"gateway": [(gw, {})], "agent": [(agent, {"replica": "r0"})]})
        pid = prom.proc.pid
        prom.wait_scraped(("gateway", "agent"), timeout_s=30)
        assert prom.values("flywheel_gateway_requests_total", "route") == {"/v1/completions": 5.0}
        rows = prom.query("flywheel_agent_weight_version")
        assert rows[0]["metric"]["job"] == "agent" and rows[0]["metric"]["replica"] == "r0"
        assert "__job" not in rows[0]["metric"]  # a relabelling aid, dropped after it
        deadline = time.monotonic() + 20
        while not [a for a in prom.alerts() if a["labels"]["alertname"] == "AgentBehind"]:
            assert time.monotonic() < deadline, "the rule never fired"
            time.sleep(0.5)
        # The fleet changes: a target removed from the file is no longer scraped (file_sd, no restart).
        prom.set_targets({"gateway": [(gw, {})]})
        deadline = time.monotonic() + 30
        while "agent" in prom.targets_health():
            assert time.monotonic() < deadline, "the removed target is still scraped"
            time.sleep(0.5)
        with pytest.raises(ValueError, match="parse error"):
            prom.query("sum(")
    finally:
        prom.stop()
        for s in servers:
            s.shutdown()
    assert not pid_alive(pid)


def test_a_missing_prometheus_is_a_clear_error(tmp_path):
    prom = Prometheus(PrometheusConfig(data_dir=tmp_path, binary="no-such-prometheus-binary", rule_files=[]))
    with pytest.raises(FileNotFoundError, match="apt-get install prometheus"):
        prom.start({})


@needs_prometheus
def test_observe_scrapes_the_replicas_the_gateway_names_and_stops(tmp_path, capsys):
    """`flywheel observe` against a gateway-shaped server (its /admin/replicas and /metrics): Prometheus is
    started once, scrapes, and is gone when the command returns; a gateway it cannot read is one clear line."""
    import http.server
    import json
    import threading

    from flywheel.observe.command import ObserveConfig, run

    port = free_port()

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/admin/replicas":
                if self.headers.get("Authorization") != "Bearer t0ken":
                    self.send_error(401)
                    return
                body = json.dumps({"replicas": [{"id": "r0", "url": f"http://127.0.0.1:{port}"}]}).encode()
            else:
                body = b"flywheel_kafka_up 1\n"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = ObserveConfig(gateway=f"http://127.0.0.1:{port}", admin_token="t0ken", out_dir=tmp_path, minutes=0.1)
        assert run(cfg) == 0
        out = capsys.readouterr().out
        assert "prometheus http://127.0.0.1:" in out and "prometheus stopped" in out
        groups = json.loads((tmp_path / "prometheus" / "targets.json").read_text())
        assert {g["labels"]["__job"] for g in groups} == {"gateway", "sglang"}
        assert not [
            line
            for line in (tmp_path / "prometheus" / "prometheus.log").read_text().splitlines()
            if "level=error" in line
        ]
        with pytest.raises(RuntimeError, match="cannot read the replicas from the gateway"):
            run(ObserveConfig(gateway=f"http://127.0.0.1:{port}", admin_token="wrong", out_dir=tmp_path, minutes=0.1))
    finally:
        server.shutdown()
    import psutil

    assert not [
        p for p in psutil.process_iter(["name", "cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
