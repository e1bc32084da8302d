"""Small HTTP helpers and the test gateway's credentials, shared by the integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from infra import kafka_auth

GATEWAY_KEYS = {"alice": "key-alice", "bob": "key-bob"}
GATEWAY_ADMIN = "admin-secret"
STORE_TOKEN = "test-fleet-read-credential"  # what store_server() wants (weight_sync.fleet_credential)
CLIENTS = Path(__file__).resolve().parent / "clients"  # scripts and configs for the real agent clients


def node_modules() -> Path:
    """The pinned npm clients (Codex CLI, Claude Code, Continue's schemas) scripts/setup.sh installed."""
    from infra.paths import flywheel_home

    path = flywheel_home() / "npm" / "node_modules"
    assert (path / ".bin").is_dir(), f"{path} is missing: run `make setup` (scripts/setup.sh installs the clients)"
    return path


def post(url, body=None, key=None, raw: bytes | None = None, headers=None, timeout=60):
    """POST JSON (or raw bytes); returns (status, parsed JSON body or None, headers)."""
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload, hdrs = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, payload, hdrs = e.code, e.read(), dict(e.headers)
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = payload.decode(errors="replace")
    return status, parsed, hdrs


def get(url, key=None, timeout=30):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class TcpProxy:
    """A loopback TCP forwarder that can be switched off and on, to make a real replica vanish and return,
    or stalled: connections stay open and nothing more goes through (a replica that hangs)."""

    def __init__(self, target_port: int):
        import socket

        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._loop = None
        self._server = None
        self._writers = set()
        self.stalled = False
        import asyncio
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, coro):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def start(self) -> None:
        import asyncio

        async def pipe(reader, writer):
            try:
                while data := await reader.read(65536):
                    while self.stalled:
                        await asyncio.sleep(0.05)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        async def handle(reader, writer):
            self._writers.add(writer)
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            self._writers.add(uw)
            await asyncio.gather(pipe(reader, uw), pipe(ur, writer))

        async def serve():
            self._server = await asyncio.start_server(handle, "127.0.0.1", self.port, reuse_address=True)

        self._run(serve())

    def stop(self) -> None:
        async def close():
            if self._server is not None:
                self._server.close()
                for w in list(self._writers):
                    w.close()
                self._writers.clear()
                await self._server.wait_closed()
                self._server = None

        self._run(close())

    def shutdown(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


@contextlib.contextmanager
def store_server(store: Path):
    """`flywheel weights serve` on a free loopback port over a store directory, wanting STORE_TOKEN: yields its
    URL, stops it by PID (also when the test fails)."""
    from infra.paths import REPO_ROOT
    from infra.procs import free_port, stop_pid, wait_until

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "weights", "serve", "--store", str(store), "--port", str(port)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "FLYWHEEL_STORE_TOKEN": STORE_TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(f"{url}/versions", key=STORE_TOKEN)[0] == 200, 30, what="store server")
        yield url
    finally:
        assert stop_pid(proc.pid), f"store server pid {proc.pid} did not stop"


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """A tmpfs of `size` (e.g. "256k") mounted at `path`: a disk that fills up (root is available here and in
    CI). Unmounted when the test ends, also when it fails."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.asynccontextmanager
async def serving_app(app):
    """An aiohttp app on a free loopback port, in the running loop: yields its URL; cleaned up after."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def loopback_app(handler) -> tuple[object, str]:
    """An aiohttp app answering every GET with `handler`, on a free loopback port, in the running loop (a
    proxy in front of a real server). Returns its runner (the caller awaits runner.cleanup()) and its URL."""
    from aiohttp import web

    from infra.procs import free_port

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def served_samples(model_dir: Path, n: int | None = None, tasks: int = 6, seed: int = 3) -> list:
    """Samples as the trainer gets them (token ids, behaviour logprobs, routed experts) from the model's own
    completions of `tasks` training tasks, 2 each; rewards alternate; groups of 4."""
    import torch
    from tokenizers import Tokenizer

    from online_rl.data.simulate import as_samples, heldout_split, sample_completions
    from online_rl.model.transformer import load_pretrained

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    raw = sample_completions(
        load_pretrained(model_dir), tok, heldout_split()[0][:tasks], 2, torch.Generator().manual_seed(seed)
    )
    return as_samples(raw, lambda i: i % 2, group_size=4)[:n]


def events_until(bootstrap: str, topic: str, done, timeout_s: float = 60.0) -> list:
    """The decoded events of `topic` from its start, read until `done(events)` holds or timeout_s passes (the
    caller's assert then says what is missing). For what a gateway answered for: its shipper sends it a moment
    later, and waiting for a silence instead would cost that silence on every call."""
    import time

    from kafka import KafkaConsumer

    from contracts import events as ev

    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    events: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while not done(events) and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=200).values():
                for r in records:
                    try:
                        events.append(ev.decode(r.value))
                    except ev.SchemaError:  # not an event of ours (a shared broker): skipped, as audits do
                        continue
    finally:
        c.close()
    return events


def read_topic(bootstrap: str, topic: str, keys: set[str] | None = None) -> list[tuple[str, bytes]]:
    """(key, value) of a topic's records from its start to its end now (call it once they are acknowledged: a
    spool drained), only those keyed by `keys` if given (a shared broker holds other tests' records too)."""
    from infra.kafka_admin import records_to_end

    records = [(r.key.decode(), r.value) for r in records_to_end(bootstrap, topic) if r.key]
    return records if keys is None else [(k, v) for k, v in records if k in keys]


def sse(text: str) -> list[dict]:
    """The JSON payloads of a body of server-sent events."""
    import orjson

    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def completion_event(cid, ts, source="user", choice=0, session="", tenant="t"):
    """A small completion event (3 prompt tokens, 2 output, routed experts of the test model's shape)."""
    import numpy as np

    from contracts import events as ev

    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=choice,
        tenant=tenant,
        model_version=2,
        prompt_ids=np.array([0, 5, 6], np.int32),
        output_ids=np.array([7, 8], np.int32),
        logprobs=np.array([-0.1, -0.2], np.float32),
        routed_experts=np.zeros((4, 2, 2), np.uint8),
        sampling={},
        finish_reason="stop",
        latency={},
        source=source,
        ts=ts,
        session_id=session,
    )


@contextlib.contextmanager
def broker_on_a_test_host(data: Path):
    """One test host and a broker on this machine's bridge address (`flywheel kafka start --host`), its data in
    `data`: yields (the host, the broker's state file as read); the broker is stopped and the host removed."""
    from flywheel.cli import main
    from flywheel.hosts.netns import HostsConfig, TestHosts

    with TestHosts.up(HostsConfig(n=1)) as hosts:
        (host,) = hosts.hosts
        assert main(["kafka", "start", "--host", hosts.gateway_addr, "--data-dir", str(data)]) == 0
        try:
            state = json.loads((data / "broker.json").read_text())
            assert state["bootstrap"].startswith(f"{hosts.gateway_addr}:")
            yield host, state
        finally:
            assert main(["kafka", "stop", "--data-dir", str(data)]) == 0
