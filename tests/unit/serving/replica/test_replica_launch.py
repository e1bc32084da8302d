"""serving.replica.launch: a replica's keys reach SGLang's arguments inside the process, never its command
line or its children's environment, and never leave in an info endpoint's answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from contracts import replica_keys
from infra.paths import REPO_ROOT
from serving.replica.launch import RedactKeys


def _launch(tmp_path, probe: str, keys: dict) -> object:
    """Run serving.replica.launch on a probe module (in tmp_path) instead of SGLang: what the probe printed."""
    (tmp_path / "probe_launch.py").write_text(probe)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tmp_path)]), **keys}
    out = subprocess.run(
        [sys.executable, "-m", "serving.replica.launch", "probe_launch", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keys_go_from_the_environment_into_argv_and_out_of_the_environment(tmp_path):
    probe = (
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': [k for k in os.environ if k.startswith('FLYWHEEL_REPLICA')],"
        " 'cmdline': open('/proc/self/cmdline', 'rb').read().decode(errors='replace')}))\n"
    )
    seen = _launch(tmp_path, probe, replica_keys.env("inf-key-1", "adm-key-2"))
    assert seen["argv"] == ["--port", "1", "--api-key", "inf-key-1", "--admin-api-key", "adm-key-2"]
    assert seen["env"] == []  # SGLang's children inherit no key
    assert "inf-key-1" not in seen["cmdline"] and "adm-key-2" not in seen["cmdline"]


def test_without_keys_nothing_is_added(tmp_path):
    assert _launch(tmp_path, "import json, sys\nprint(json.dumps(sys.argv[1:]))\n", replica_keys.env(None)) == [
        "--port",
        "1",
    ]


def _call(middleware, method: str, body: bytes) -> tuple[dict, bytes]:
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": body})

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(middleware(app)({"type": "http", "method": method, "path": "/server_info"}, receive, send))
    return sent[0], sent[1]["body"]


def test_an_info_answer_never_carries_a_key():
    def middleware(app):
        return RedactKeys(app, secrets=[b"adm-key-2", b"inf-key-1"])

    start, body = _call(middleware, "GET", b'{"api_key": "inf-key-1", "admin_api_key": "adm-key-2"}')
    assert body == b'{"api_key": "<redacted>", "admin_api_key": "<redacted>"}'
    assert (b"content-length", b"5") not in start["headers"]
    start, body = _call(middleware, "POST", b'{"text": "inf-key-1"}')  # generation is the model's own text
    assert body == b'{"text": "inf-key-1"}' and (b"content-length", b"5") in start["headers"]
