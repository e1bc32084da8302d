"""Test hosts: N network namespaces on one bridge, so a fleet can be laid over "machines" that talk by
address, on this one machine (`flywheel hosts up N`, the `hosts` pytest fixture).

    root namespace:  bridge <prefix><k>br  198.18.<k>.254/24   (this machine reaches every host)
    host i:          namespace <prefix><k>h<i>, eth0 198.18.<k>.<i+1>/24 (a veth on the bridge), its own lo

Addresses come from 198.18.0.0/15, the range set aside for benchmarking (RFC 2544): never a private or a
public one. Each set of hosts takes one /24 (k in 0..511), the first one free. The namespaces have no
default route, so their traffic cannot leave them. A link can be shaped (`tc ... tbf`: this kernel has no
netem). Everything made is recorded in $FLYWHEEL_HOME/hosts/<k>.json with the identity of the process
that owns it: `down()` (and the context manager's exit, on failure or interrupt too) removes it, killing
whatever still runs inside, and a later `up()` removes sets whose owner died (kill -9) before choosing its
own. Needs root (ip netns).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.core.paths import flywheel_home
from flywheel.core.procs import identity, read_state, same_process, spawn, write_state

log = logging.getLogger(__name__)
NETWORK = ipaddress.ip_network("198.18.0.0/15")
SUBNETS = 512  # /24s in the /15


@dataclass
class HostsConfig:
    n: int = 3
    prefix: str = "fw"  # names: namespaces <prefix><k>h<i>, bridge <prefix><k>br, veths <prefix><k>v<i>
    rate_mbit: float | None = None  # shape every host's link with tbf (None: as fast as the bridge goes)
    state_dir: Path | None = None  # default $FLYWHEEL_HOME/hosts

    def __post_init__(self):
        if not 1 <= self.n <= 250:
            raise ValueError(f"hosts: n must be 1..250, got {self.n}")
        if not self.prefix.isalnum() or len(self.prefix) > 4:
            raise ValueError("hosts: the prefix is 1-4 letters or digits (interface names are 15 bytes at most)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def _subnet(k: int) -> ipaddress.IPv4Network:
    return list(NETWORK.subnets(new_prefix=24))[k]


@dataclass
class Host:
    index: int
    netns: str
    addr: str  # this host's address (its services bind to it)
    iface: str = "eth0"

    def cmd(self, argv: list[str]) -> list[str]:
        """argv, run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(argv), **kw)

    def spawn(self, argv: list[str], **kw) -> subprocess.Popen:
        """A server on this host (flywheel.core.procs.spawn: its own group, ended with its parent)."""
        return spawn(self.cmd(argv), **kw)

    def shape(self, rate_mbit: float, burst_kbit: int = 256, latency_ms: int = 50) -> None:
        """Bound this host's outgoing bandwidth (token bucket; delay is not available on this kernel)."""
        _ip(
            "netns",
            "exec",
            self.netns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            self.iface,
            "root",
            "tbf",
            "rate",
            f"{rate_mbit}mbit",
            "burst",
            f"{burst_kbit}kbit",
            "latency",
            f"{latency_ms}ms",
        )

    def pids(self) -> list[int]:
        r = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in r.stdout.split()]


@dataclass
class TestHosts:
    k: int
    cfg: HostsConfig
    hosts: list[Host] = field(default_factory=list)
    __test__ = False  # not a pytest class

    @property
    def bridge(self) -> str:
        return f"{self.cfg.prefix}{self.k}br"

    @property
    def gateway_addr(self) -> str:
        """The root namespace's address on the bridge: how a host reaches a server on this machine."""
        return str(_subnet(self.k).network_address + 254)

    @property
    def state_file(self) -> Path:
        return _state_dir(self.cfg) / f"{self.k}.json"

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, cfg: HostsConfig | None = None, persistent: bool = False) -> TestHosts:
        """Make cfg.n hosts, owned by this process: they are freed when it dies (by the next `up`). A
        persistent set (the command line's) stays until `flywheel hosts down`."""
        cfg = cfg or HostsConfig()
        if os.geteuid() != 0:
            raise PermissionError("test hosts need root (ip netns, veth, bridge)")
        reap_stale(cfg)
        self = cls(k=_claim(cfg), cfg=cfg)
        try:
            net = _subnet(self.k)
            _ip("link", "add", "name", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(cfg.n):
                host = Host(i, f"{cfg.prefix}{self.k}h{i}", str(net.network_address + 1 + i))
                veth = f"{cfg.prefix}{self.k}v{i}"
                _ip("netns", "add", host.netns)
                self.hosts.append(host)
                _ip("link", "add", veth, "type", "veth", "peer", "name", host.iface, "netns", host.netns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.iface)
                _ip("-n", host.netns, "link", "set", host.iface, "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
                if cfg.rate_mbit:
                    host.shape(cfg.rate_mbit)
            self._record(persistent)
        except BaseException:
            self.down()
            raise
        log.info("test hosts %s: %s", self.k, ", ".join(f"{h.netns}={h.addr}" for h in self.hosts))
        return self

    def _record(self, persistent: bool) -> None:
        state = {
            "k": self.k,
            "owner": None if persistent else identity(os.getpid()),
            "bridge": self.bridge,
            "hosts": [{"netns": h.netns, "addr": h.addr} for h in self.hosts],
            "prefix": self.cfg.prefix,
        }
        write_state(self.state_file, state)

    def down(self) -> None:
        """Remove every namespace, veth and the bridge, ending what still runs inside. Idempotent."""
        _teardown(self.cfg.prefix, self.k, [h.netns for h in self.hosts] or _netns_named(self.cfg.prefix, self.k))
        self.state_file.unlink(missing_ok=True)

    def __enter__(self) -> TestHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def view(self) -> dict:
        return {
            "k": self.k,
            "bridge": self.bridge,
            "gateway": self.gateway_addr,
            "hosts": [{"netns": h.netns, "addr": h.addr} for h in self.hosts],
        }


# ---------------------------------------------------------------------- bookkeeping


def _state_dir(cfg: HostsConfig) -> Path:
    d = Path(cfg.state_dir) if cfg.state_dir else flywheel_home() / "hosts"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _links() -> set[str]:
    out = json.loads(_ip("-j", "link", "show").stdout or "[]")
    return {x["ifname"] for x in out}


def _netns() -> set[str]:
    r = _ip("-j", "netns", "list", check=False)
    return {x["name"] for x in json.loads(r.stdout or "[]")}


def _netns_named(prefix: str, k: int) -> list[str]:
    return sorted(n for n in _netns() if n.startswith(f"{prefix}{k}h") and n[len(f"{prefix}{k}h") :].isdigit())


def _claim(cfg: HostsConfig) -> int:
    """The first /24 that no recorded set, bridge or namespace of ours uses; recorded at once (O_EXCL),
    so two runs starting together never take the same one, and owned by this process until it is made
    (a run killed while making it leaves a record the next `up` reaps)."""
    links, spaces = _links(), _netns()
    for k in range(SUBNETS):
        if f"{cfg.prefix}{k}br" in links or any(n.startswith(f"{cfg.prefix}{k}h") for n in spaces):
            continue
        path = _state_dir(cfg) / f"{k}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"k": k, "prefix": cfg.prefix, "owner": identity(os.getpid())}, f)
        return k
    raise RuntimeError("no free /24 left in 198.18.0.0/15 for test hosts")


def _teardown(prefix: str, k: int, namespaces: list[str]) -> None:
    for ns in namespaces:
        for pid in Host(0, ns, "").pids():  # nothing made here outlives its host
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("netns", "del", ns, check=False)  # takes its end of the veth, and so the pair, along
    _ip("link", "del", f"{prefix}{k}br", check=False)


def _teardown_recorded(state: dict, cfg: HostsConfig) -> None:
    prefix, k = state.get("prefix", cfg.prefix), int(state["k"])
    # A record made while claiming has no hosts yet: whatever namespaces of that set exist go too.
    spaces = {h["netns"] for h in state.get("hosts", [])} | set(_netns_named(prefix, k))
    _teardown(prefix, k, sorted(spaces))


def reap_stale(cfg: HostsConfig | None = None) -> list[int]:
    """Remove the sets whose owner has died (a test run killed -9). Sets made from the command line
    (no owner) stay until `flywheel hosts down`."""
    cfg = cfg or HostsConfig()
    reaped = []
    for path in sorted(_state_dir(cfg).glob("*.json")):
        state = read_state(path)
        if state is None or state.get("owner") is None or same_process(state["owner"]):
            continue
        k = int(state["k"])
        _teardown_recorded(state, cfg)
        path.unlink(missing_ok=True)
        log.warning("removed test hosts %d: their owner (pid %s) is gone", k, state["owner"].get("pid"))
        reaped.append(k)
    return reaped


def recorded(cfg: HostsConfig | None = None) -> list[dict]:
    cfg = cfg or HostsConfig()
    return [s for p in sorted(_state_dir(cfg).glob("*.json")) if (s := read_state(p)) is not None]


def down_recorded(k: int, cfg: HostsConfig | None = None) -> bool:
    """`flywheel hosts down K`: remove a recorded set, whoever made it."""
    cfg = cfg or HostsConfig()
    path = _state_dir(cfg) / f"{k}.json"
    state = read_state(path)
    if state is None:
        return False
    _teardown_recorded(state, cfg)
    path.unlink(missing_ok=True)
    return True
