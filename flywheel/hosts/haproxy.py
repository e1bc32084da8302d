"""HAProxy in front of several gateways: what IDE clients reach when one gateway process is not enough.

    clients -> haproxy <addr>:<port> -> gateway 0, gateway 1, ... (least outstanding requests)

Debian's haproxy (scripts/setup.sh installs it when missing), run in the foreground by the process that
needs it, never as a system service. Each gateway is checked on /health every `check_ms`; a gateway that
answers (200, or 503 while degraded: it still serves) is in rotation. A connection a dead gateway refuses
is dispatched to another one (`retries` + `option redispatch`), so only requests already in flight on a
gateway that dies fail; a request is never sent twice once a gateway has taken it. Such a request, when
it was not the first on its client's keep-alive connection, ends as HAProxy ends a failed keep-alive
request: the client's connection is closed with no answer (no 502), and neither the log nor the server's
error count has it (seen in loadtests.fleet_drill); the client sees a connection error.
"""

from __future__ import annotations

import csv
import secrets
import shutil
import socket as socketlib
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from infra.procs import in_netns, spawn, stop_pid, tail, wait_until

SERVED_BY = "X-Flywheel-Gateway"  # response header naming the gateway that answered (its server name)


@dataclass
class HaproxyConfig:
    backends: list[str]  # the gateways' base URLs, http://host:port
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    netns: str | None = None  # a test host's network namespace to run in
    check_ms: int = 500  # health check interval; a gateway is out after `fall` failed checks
    fall: int = 2
    rise: int = 2
    connect_timeout_s: float = 2.0
    # Longer than the gateway's own request timeout (300 s): the gateway, not the balancer, ends slow requests.
    request_timeout_s: float = 330.0
    maxconn: int = 4096
    # The stats socket: a short path of its own (a Unix socket path is at most 107 bytes; pytest's
    # temporary directories can be longer).
    socket: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / f"fw-haproxy-{secrets.token_hex(4)}.sock"
    )


def render(cfg: HaproxyConfig) -> str:
    servers = []
    for i, url in enumerate(cfg.backends):
        hostport = url.split("://", 1)[-1].rstrip("/")
        servers.append(f"    server gw{i} {hostport} check inter {cfg.check_ms} fall {cfg.fall} rise {cfg.rise}")
    lines = [
        "global",
        f"    maxconn {cfg.maxconn}",
        f"    stats socket {cfg.socket} mode 600 level user",
        # One line per request in haproxy.log (the process's stdout): which gateway took it, how it ended.
        "    log stdout format raw local0 info",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        f"    timeout connect {int(cfg.connect_timeout_s * 1000)}ms",
        f"    timeout client {int(cfg.request_timeout_s)}s",
        f"    timeout server {int(cfg.request_timeout_s)}s",
        f"    timeout queue {int(cfg.request_timeout_s)}s",
        "    timeout http-keep-alive 10s",
        # A new connection to the gateway per request: a killed gateway then fails only the requests it had
        # taken, never one sent down a pooled connection it left behind.
        "    option http-server-close",
        "    retries 2",
        "    option redispatch 1",
        "frontend flywheel",
        f"    bind {cfg.host}:{cfg.port}",
        "    default_backend gateways",
        "backend gateways",
        "    balance leastconn",
        "    option httpchk GET /health",
        "    http-check expect rstatus ^(200|503)$",
        f"    http-response set-header {SERVED_BY} %[srv_name]",
        *servers,
        "",
    ]
    return "\n".join(lines)


@dataclass
class Haproxy:
    pid: int
    url: str
    config_file: Path
    log_file: Path
    socket: Path

    def stop(self, timeout: float = 10.0) -> bool:
        gone = stop_pid(self.pid, timeout)
        self.socket.unlink(missing_ok=True)
        return gone

    def servers(self) -> dict[str, dict]:
        """The balancer's own view, from its stats socket: gateway server name (gw0, ...) -> {"status": UP /
        DOWN / ..., "sessions": requests it has on that gateway now, "errors": answers from it that failed so
        far (5xx, or the connection broken before an answer)}."""
        with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = list(csv.reader(data.decode().lstrip("# ").splitlines()))
        head = rows[0]
        px, sv, status, scur, eresp, h5 = (
            head.index(k) for k in ("pxname", "svname", "status", "scur", "eresp", "hrsp_5xx")
        )
        return {
            r[sv]: {
                "status": r[status].split()[0],
                "sessions": int(r[scur] or 0),
                "errors": int(r[eresp] or 0) + int(r[h5] or 0),
            }
            for r in rows[1:]
            if len(r) > status and r[px] == "gateways" and r[sv] not in ("FRONTEND", "BACKEND")
        }


def _reaches_a_gateway(url: str) -> bool:
    """A request through the balancer answered by a gateway (named in SERVED_BY; the balancer's own 503
    "no server available" is not)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return bool(r.headers.get(SERVED_BY))
    except urllib.error.HTTPError as e:
        return bool(e.headers.get(SERVED_BY))  # a degraded gateway (503) still serves
    except OSError:
        return False


def start(cfg: HaproxyConfig, timeout_s: float = 30.0) -> Haproxy:
    """Write the configuration, check it (`haproxy -c`), start haproxy in the foreground and wait until a
    request through it reaches a gateway."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(binary).exists():
        raise FileNotFoundError("haproxy is not installed (scripts/setup.sh installs it from Debian)")
    d = Path(cfg.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    conf, log_file = d / "haproxy.cfg", d / "haproxy.log"
    conf.write_text(render(cfg))
    checked = subprocess.run([binary, "-c", "-q", "-f", str(conf)], capture_output=True, text=True)
    if checked.returncode != 0:
        raise ValueError(f"haproxy refused {conf}: {checked.stderr.strip() or checked.stdout.strip()}")
    cmd = [binary, "-db", "-f", str(conf)]  # -db: foreground, no daemon; its pid is the balancer's
    cmd = in_netns(cfg.netns, cmd)
    with open(log_file, "ab") as log:
        proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lb = Haproxy(
        pid=proc.pid, url=f"http://{cfg.host}:{cfg.port}", config_file=conf, log_file=log_file, socket=cfg.socket
    )
    try:
        wait_until(
            lambda: _reaches_a_gateway(lb.url),
            timeout_s,
            interval=0.2,
            what=f"haproxy on {lb.url}",
            alive=lambda: proc.poll() is None,
        )
    except (TimeoutError, RuntimeError) as e:
        lb.stop()
        raise RuntimeError(f"{e}\n--- {log_file} ---\n{tail(log_file)}") from None
    return lb
