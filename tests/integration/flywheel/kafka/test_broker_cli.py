"""`flywheel kafka start|status|stop` round trip, and a restart on the same data dir keeps the data."""

import json
import os
import subprocess
import sys

import pytest
from kafka import KafkaProducer

from infra import kafka_auth
from infra.kafka_admin import records_to_end
from infra.paths import REPO_ROOT

pytestmark = pytest.mark.timeout(300)


def _flywheel(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *args], capture_output=True, text=True, env=env, timeout=200
    )


def test_start_status_stop_restart(tmp_path):
    data = str(tmp_path / "kafka")
    started = _flywheel("kafka", "start", "--data-dir", data)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout.strip().splitlines()[-1])
    try:
        st = _flywheel("kafka", "status", "--data-dir", data)
        assert st.returncode == 0 and json.loads(st.stdout)["answering"] is True
        again = _flywheel("kafka", "start", "--data-dir", data)
        assert again.returncode != 0 and "already running" in again.stderr

        producer = KafkaProducer(
            bootstrap_servers=info["bootstrap"], **kafka_auth.client_config(), acks="all", compression_type="zstd"
        )
        producer.send("survives", b"before-restart").get(timeout=30)
        producer.close()

        assert _flywheel("kafka", "stop", "--data-dir", data).returncode == 0
        st = _flywheel("kafka", "status", "--data-dir", data)
        assert st.returncode != 0 and json.loads(st.stdout)["running"] is False

        restarted = _flywheel("kafka", "start", "--data-dir", data)
        assert restarted.returncode == 0, restarted.stderr
        info2 = json.loads(restarted.stdout.strip().splitlines()[-1])
        assert info2["bootstrap"] == info["bootstrap"]  # same ports: clients reconnect by themselves
        assert [r.value for r in records_to_end(info2["bootstrap"], "survives", timeout_s=60)] == [b"before-restart"]
    finally:
        _flywheel("kafka", "stop", "--data-dir", data)
    assert not os.path.exists(os.path.join(data, "broker.json"))
