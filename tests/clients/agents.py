"""The real agent clients, headless, pointed at a Flywheel gateway: OpenAI's Codex CLI on /v1/responses and
Anthropic's Claude Code on /v1/messages (pinned in flywheel/clients_npm, installed by scripts/setup.sh).

Each runs one task in a workspace of its own (a task's signature and docstring in app.py, its tests in
test_app.py, run with `python3 test_app.py`), inside a bubblewrap jail: the root file system read-only, only
its workspace, its home and a private /tmp writable, its own PID namespace, ended with the test. The
commands the model writes run there (each client's own approval prompts are off: headless). The network is
the host's loopback, where the gateway listens; every other destination is switched off in the clients'
configuration (telemetry, updates, plugins: README, "Agent clients"), and this machine reaches no model API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from online_rl.tasks import synthetic as T
from tests.helpers import node_modules

CODEX_CONFIG = """\
model = "flywheel-coder"
model_provider = "flywheel"
check_for_update_on_startup = false
web_search = "disabled"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[features]
plugins = false
goals = false
view_image = false
apps = false
skill_search = false
memories = false

[agents]
enabled = false

[tools]
experimental_request_user_input = {{ enabled = false }}

[skills]
include_instructions = false

[model_providers.flywheel]
name = "Flywheel"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "FLYWHEEL_API_KEY"
"""
ASK = "Fix app.py so that python3 test_app.py passes."


def test_runner(task: T.Task) -> str:
    """test_app.py: the task's tests, run by `python3 test_app.py`, a pytest-like summary and exit status."""
    cases = list(zip(task.test_inputs(), task.expected_outputs()))
    return (
        "import sys\nfrom app import *\n\n"
        f"CASES = {cases!r}\n"
        "failed = 0\n"
        "for x, want in CASES:\n"
        "    try:\n"
        f"        got = {task.name}(*x) if isinstance(x, tuple) else {task.name}(x)\n"
        "    except Exception:\n"
        "        got = None\n"
        "    failed += got != want\n"
        "parts = [f'{n} {what}' for n, what in ((failed, 'failed'), (len(CASES) - failed, 'passed')) if n]\n"
        "print(', '.join(parts))\n"
        "sys.exit(1 if failed else 0)\n"
    )


def workspace(root: Path, task: T.Task) -> Path:
    ws = root / "work"
    ws.mkdir(parents=True)
    (ws / "app.py").write_text(task.prompt)
    (ws / "test_app.py").write_text(test_runner(task))
    return ws


def jail(cmd: list[str], ws: Path, home: Path) -> list[str]:
    """`cmd` in bubblewrap: read-only root, writable workspace, home and /tmp, own PID/IPC/UTS namespaces."""
    return [
        "bwrap",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--bind", str(home), str(home),
        "--bind", str(ws), str(ws),
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent", "--new-session",
        "--chdir", str(ws),
        *cmd,
    ]  # fmt: skip


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str
    workspace: Path

    def passes(self) -> bool:
        """Whether the task's tests pass on the file the agent left."""
        out = subprocess.run(["python3", "test_app.py"], cwd=self.workspace, capture_output=True, timeout=60)
        return out.returncode == 0


def _env(home: Path, extra: dict) -> dict:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    return {**keep, "HOME": str(home), "TMPDIR": "/tmp", **extra}


def run_codex(base_url: str, key: str, root: Path, task: T.Task, timeout_s: float) -> Run:
    """`codex exec` on the task, through /v1/responses."""
    home = root / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(base_url=base_url))
    ws = workspace(root, task)
    codex = node_modules() / ".bin" / "codex"
    cmd = [str(codex), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", "--ephemeral", "--json", ASK]
    env = _env(home, {"CODEX_HOME": str(home / ".codex"), "FLYWHEEL_API_KEY": key})
    return _run(jail(cmd, ws, home), env, ws, timeout_s)


def run_claude(base_url: str, key: str, root: Path, task: T.Task, timeout_s: float) -> Run:
    """`claude -p` on the task, through /v1/messages, with its Bash, Read and Write tools."""
    home = root / "home"
    home.mkdir(parents=True)
    ws = workspace(root, task)
    claude = node_modules() / ".bin" / "claude"
    cmd = [
        str(claude),
        "-p",
        ASK,
        "--model",
        "flywheel-coder",
        "--tools",
        "Bash,Read,Write",
        "--dangerously-skip-permissions",
        "--strict-mcp-config",
        "--no-session-persistence",
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    env = _env(
        home,
        {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",  # it runs in our jail; as root it refuses to skip permissions without this
        },
    )
    return _run(jail(cmd, ws, home), env, ws, timeout_s)


def _run(cmd: list[str], env: dict, ws: Path, timeout_s: float) -> Run:
    assert shutil.which("bwrap"), "bubblewrap is missing: run `make setup`"
    try:
        p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:  # bwrap --die-with-parent: the client went with it
        return Run(-1, (e.stdout or b"").decode(errors="replace"), (e.stderr or b"").decode(errors="replace"), ws)
    return Run(p.returncode, p.stdout, p.stderr, ws)


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict):
            out.append(v)
    return out
