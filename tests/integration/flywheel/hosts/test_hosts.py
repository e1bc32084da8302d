"""Test hosts (flywheel.hosts.netns): namespaces that talk by address over a bridge, cannot reach beyond it, can
be shaped, and leave nothing behind: not on exit, not after their owner is killed -9."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from flywheel.hosts.netns import HostsConfig, TestHosts, _links, _netns, reap_stale, recorded
from infra.paths import REPO_ROOT
from infra.procs import free_port, pid_alive, stop_pid, wait_until

pytestmark = pytest.mark.timeout(180)


def fetch(host, url: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """GET url from inside a host; stdout: the bytes read and the seconds the transfer took."""
    code = (
        "import urllib.request as u, sys, time; t = time.monotonic(); "
        f"n = len(u.urlopen({url!r}, timeout={timeout}).read()); sys.stdout.write(f'{{n}} {{time.monotonic() - t}}')"
    )
    return host.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout + 20)


def size(r: subprocess.CompletedProcess) -> str:
    return r.stdout.split()[0] if r.returncode == 0 else r.stderr


def serve(host, directory, port: int, bind: str):
    proc = host.spawn([sys.executable, "-m", "http.server", str(port), "--bind", bind, "--directory", str(directory)])
    wait_until(lambda: fetch(host, f"http://{bind}:{port}/", 2).returncode == 0, 60, what=f"http.server on {bind}")
    return proc


def test_hosts_talk_by_address_and_nothing_leaves(tmp_path):
    (tmp_path / "blob").write_bytes(b"x" * 1000)
    with TestHosts.up(HostsConfig(n=3)) as hosts:
        a, b, c = hosts.hosts
        net = f"198.{18 + hosts.k // 256}.{hosts.k % 256}"
        assert [h.addr for h in hosts.hosts] == [f"{net}.{i}" for i in (1, 2, 3)] and hosts.gateway_addr == f"{net}.254"
        port, port2 = free_port(), free_port()
        server = serve(a, tmp_path, port, a.addr)
        local = serve(a, tmp_path, port2, "127.0.0.1")
        assert size(fetch(b, f"http://{a.addr}:{port}/blob")) == "1000"  # host to host, by address
        assert size(fetch(c, f"http://{a.addr}:{port}/blob")) == "1000"
        with urllib.request.urlopen(f"http://{a.addr}:{port}/blob", timeout=10) as r:  # this machine, via the bridge
            assert len(r.read()) == 1000
        # Each host has its own loopback: a's 127.0.0.1 server is not b's.
        assert fetch(b, f"http://127.0.0.1:{port2}/", 2).returncode != 0
        out = fetch(b, "http://192.0.2.1:80/", 3)  # nothing routes out of a host
        assert out.returncode != 0 and "unreachable" in out.stderr.lower()
        pids = a.pids()
        assert server.pid in pids and local.pid in pids  # `ip netns exec` execs: the server keeps the pid
        names = [h.netns for h in hosts.hosts]
        veths = [f"{hosts.cfg.prefix}{hosts.k}v{i}" for i in range(3)]
        assert set(veths) <= _links()
        state = hosts.state_file
        assert state.exists()
    assert not set(names) & _netns() and not ({hosts.bridge, *veths} & _links()) and not state.exists()
    assert not any(pid_alive(p) for p in pids)  # what ran inside went with the hosts
    stop_pid(server.pid)
    stop_pid(local.pid)


def test_a_shaped_link_is_slower(tmp_path):
    size_b = 2_000_000
    (tmp_path / "blob").write_bytes(b"y" * size_b)
    with TestHosts.up(HostsConfig(n=2)) as hosts:
        a, b = hosts.hosts
        port = free_port()
        server = serve(a, tmp_path, port, a.addr)
        try:
            url = f"http://{a.addr}:{port}/blob"
            fast = fetch(b, url, 30)
            a.shape(rate_mbit=8)  # 1 MB/s out of a: 2 MB take about 2 s
            slow = fetch(b, url, 30)
            assert size(fast) == size(slow) == str(size_b)
            t_fast, t_slow = float(fast.stdout.split()[1]), float(slow.stdout.split()[1])  # the transfer alone
            assert t_slow > 1.5 and t_slow > 4 * t_fast, (t_fast, t_slow)
        finally:
            stop_pid(server.pid)


def test_the_hosts_of_a_killed_owner_are_reaped():
    code = (
        "import os, json, signal; from flywheel.hosts.netns import HostsConfig, TestHosts; "
        "h = TestHosts.up(HostsConfig(n=2)); print(json.dumps(h.view()), flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    view = json.loads(r.stdout.splitlines()[0])
    names = {h["netns"] for h in view["hosts"]}
    assert names <= _netns() and view["bridge"] in _links()  # killed -9: nothing cleaned up by it
    assert view["k"] in reap_stale()
    assert not names & _netns() and view["bridge"] not in _links()
    assert view["k"] not in [s["k"] for s in recorded()]


def test_command_line_hosts_stay_until_down():
    from flywheel.cli import main

    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "hosts", "up", "2"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout.splitlines()[0])
    try:
        assert {h["netns"] for h in view["hosts"]} <= _netns()
        assert view["k"] not in reap_stale() and view["k"] in [s["k"] for s in recorded()]  # no owner: kept
    finally:
        assert main(["hosts", "down", str(view["k"])]) == 0
    assert view["bridge"] not in _links()


def test_a_broker_on_the_bridge_serves_the_hosts(tmp_path):
    """Addresses by configuration: `flywheel kafka start --host` on this machine's bridge address, and a
    client inside a host produces to it and reads the record back."""
    from tests.helpers import broker_on_a_test_host

    with broker_on_a_test_host(tmp_path / "kafka") as (host, state):
        code = (  # as the operator (the session's login, inherited), over TLS to the bridge's address
            "from kafka import KafkaProducer, KafkaConsumer; import sys; b = sys.argv[1]; "
            "from infra.kafka_auth import client_config; login = client_config(); "
            "p = KafkaProducer(bootstrap_servers=b, acks='all', **login); p.send('hosts-probe', b'hello').get(30); "
            "c = KafkaConsumer('hosts-probe', bootstrap_servers=b, auto_offset_reset='earliest', "
            "consumer_timeout_ms=20000, **login); print(next(iter(c)).value.decode())"
        )
        argv = [sys.executable, "-c", code, state["bootstrap"]]
        r = host.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert r.returncode == 0 and r.stdout.strip() == "hello", r.stderr[-2000:]
