"""A real tool-using client, headless, against the gateway: Simon Willison's `llm` CLI (PyPI) with Python
functions as tools, pointed at our base URL and key as a user would (an OpenAI-compatible model in its
extra-openai-models.yaml). It sends OpenAI chat requests with `tools`, runs any call the model makes and
sends the results back as `tool` messages, turn after turn, up to its chain limit. The tiny model's calls
may be wrong (then the session ends with its text); the session must finish without a 4xx or 5xx."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import get

pytestmark = pytest.mark.timeout(300)

FUNCTIONS = '''
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return "def add(a, b):\\n    return a - b\\n"


def run_tests() -> str:
    """Run the test suite and report failures."""
    return "FAILED test_add: assert add(1, 2) == 3"
'''


def _llm() -> str:
    exe = Path(sys.executable).with_name("llm")
    if not exe.exists():
        pytest.fail("the llm CLI is not installed (it is a project dependency: run scripts/setup.sh)")
    return str(exe)


def _requests(gateway) -> dict[str, float]:
    """flywheel_gateway_requests_total for the chat route, by status."""
    _, body = get(f"{gateway.url}/metrics")
    out = {}
    for line in body.splitlines():
        if line.startswith("flywheel_gateway_requests_total{") and "/v1/chat/completions" in line:
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = out.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_llm_cli_runs_an_agent_session_against_the_gateway(gateway, tmp_path, stream):
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        json.dumps(
            [
                {
                    "model_id": "flywheel",
                    "model_name": "flywheel-coder",
                    "api_base": f"{gateway.url}/v1",
                    "api_key_name": "flywheel",
                    "supports_tools": True,
                }
            ]
        )
    )  # JSON is YAML
    before = _requests(gateway)
    cmd = [
        _llm(),
        "prompt",
        "-m",
        "flywheel",
        "--key",
        "key-alice",
        "--functions",
        FUNCTIONS,
        "--chain-limit",
        "4",
        "--tools-debug",
        "--no-log",
        "-o",
        "max_tokens",
        "48",
        "-o",
        "temperature",
        "0.7",
        "The tests fail in app.py. Read it, run the tests, and fix it.",
    ]
    if not stream:
        cmd.insert(2, "--no-stream")
    p = subprocess.run(cmd, env={**os.environ, "LLM_USER_PATH": str(home)}, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    after = _requests(gateway)
    turns = {s: after.get(s, 0.0) - before.get(s, 0.0) for s in after}
    assert turns.get("200", 0) >= 1, (turns, p.stdout[-1000:], p.stderr[-1000:])
    assert not {s: n for s, n in turns.items() if s != "200" and n}, turns  # no 4xx/5xx in the session
    shutil.rmtree(home, ignore_errors=True)
