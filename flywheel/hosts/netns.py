"""Test hosts: N network namespaces on one bridge, so a fleet can be laid over "machines" that talk by
address, on this one machine (`flywheel hosts up N`; in tests, `with TestHosts.up(...) as hosts`).

    root namespace:  bridge <prefix><k>br  198.18.<k>.254/24   (this machine reaches every host)
    host i:          namespace <prefix><k>h<i>, eth0 198.18.<k>.<i+1>/24 (a veth on the bridge), its own lo

Addresses come from 198.18.0.0/15, the range set aside for benchmarking (RFC 2544): never a private or a
public one. Each set takes one /24 (k in 0..511), the first one whose names and addresses nothing on the
machine uses. The namespaces have no default route, so their traffic cannot leave them. A link can be
shaped (`tc ... tbf`: this kernel has no netem).

Namespaces are machine-wide, so their bookkeeping is too: /run/flywheel/hosts/<k>.json records each set
and the identity of the process that owns it, and every change (claim, reap, remove) happens under one
lock there, so concurrent runs neither share a /24 nor remove each other's. `down()` (and the context
manager's exit, on failure or interrupt too) removes a set, killing whatever still runs inside; a later
`up()` removes the sets whose owner died (kill -9) before choosing its own. Needs root (ip netns).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.config import option
from infra.procs import identity, in_netns, read_state, same_process, spawn, write_state

log = logging.getLogger(__name__)
NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
SUBNETS = 512  # /24s in the /15
STATE_DIR = Path("/run/flywheel/hosts")  # machine-wide, like the namespaces (and gone at reboot, as they are)


@dataclass
class HostsConfig:
    n: int = 3
    prefix: str = "fw"  # names: namespaces <prefix><k>h<i>, bridge <prefix><k>br, veths <prefix><k>v<i>
    rate_mbit: float | None = option(None, help="shape each host's link (tbf; None: as fast as the bridge goes)")
    state_dir: Path = STATE_DIR

    def __post_init__(self):
        if not 1 <= self.n <= 250:
            raise ValueError(f"hosts: n must be 1..250, got {self.n}")
        # Letters only: a digit would let two prefixes name the same thing (a1 + 23 = a12 + 3); ASCII and
        # four at most keep every interface name within Linux's 15 bytes.
        if not (self.prefix.isascii() and self.prefix.isalpha() and len(self.prefix) <= 4):
            raise ValueError("hosts: the prefix is 1-4 ASCII letters")


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
        """argv, run inside this host's namespace (`ip netns exec` execs it: it keeps the pid)."""
        return in_netns(self.netns, argv)

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(argv), **kw)

    def spawn(self, argv: list[str], **kw) -> subprocess.Popen:
        """A server on this host (infra.procs.spawn: its own group, ended with its parent)."""
        return spawn(self.cmd(argv), **kw)

    def shape(self, rate_mbit: float, burst_kbit: int = 256, latency_ms: int = 50) -> None:
        """Bound this host's outgoing bandwidth (token bucket; delay is not available on this kernel)."""
        tbf = ["rate", f"{rate_mbit}mbit", "burst", f"{burst_kbit}kbit", "latency", f"{latency_ms}ms"]
        _ip("netns", "exec", self.netns, "tc", "qdisc", "replace", "dev", self.iface, "root", "tbf", *tbf)

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
        return Path(self.cfg.state_dir) / f"{self.k}.json"

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, cfg: HostsConfig | None = None, persistent: bool = False) -> TestHosts:
        """Make cfg.n hosts, owned by this process: they are freed when it dies (by the next `up`). A
        persistent set (the command line's) stays until `flywheel hosts down`."""
        cfg = cfg or HostsConfig()
        if os.geteuid() != 0:
            raise PermissionError("test hosts need root (ip netns, veth, bridge)")
        with _locked(cfg):
            reap_stale(cfg, locked=True)
            self = cls(k=_claim(cfg), cfg=cfg)
            try:
                self._make(persistent)
            except BaseException:
                self._remove()
                raise
        log.info("test hosts %s: %s", self.k, ", ".join(f"{h.netns}={h.addr}" for h in self.hosts))
        return self

    def _make(self, persistent: bool) -> None:
        cfg, net = self.cfg, _subnet(self.k)
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
        write_state(self.state_file, {**self.view(), "prefix": cfg.prefix, "owner": _owner(persistent)})

    def _remove(self) -> None:
        veths = [f"{self.cfg.prefix}{self.k}v{h.index}" for h in self.hosts]
        _teardown(self.cfg.prefix, self.k, [h.netns for h in self.hosts], veths)
        self.state_file.unlink(missing_ok=True)

    def down(self) -> None:
        """Remove every namespace, veth and the bridge, ending what still runs inside. Idempotent."""
        with _locked(self.cfg):
            self._remove()

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


def _owner(persistent: bool) -> dict | None:
    return None if persistent else identity(os.getpid())


@contextlib.contextmanager
def _locked(cfg: HostsConfig):
    """One change to the machine's test hosts at a time (claims, reaps, removals)."""
    d = Path(cfg.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _links() -> set[str]:
    return {x["ifname"] for x in json.loads(_ip("-j", "link", "show").stdout or "[]")}


def _netns() -> set[str]:
    r = _ip("-j", "netns", "list", check=False)
    return {x["name"] for x in json.loads(r.stdout or "[]")}


def _addresses_in_use() -> set[str]:
    out = json.loads(_ip("-j", "addr", "show").stdout or "[]")
    return {a["local"] for x in out for a in x.get("addr_info", []) if a.get("family") == "inet"}


def _claim(cfg: HostsConfig) -> int:
    """The first /24 that no record, interface, namespace or address on this machine uses, recorded at
    once as this process's (under the lock, so no other run can take it meanwhile)."""
    names, addrs = _links() | _netns(), _addresses_in_use()
    for k in range(SUBNETS):
        if (Path(cfg.state_dir) / f"{k}.json").exists() or _names_of(cfg.prefix, k, names):
            continue
        if any(ipaddress.ip_address(a) in _subnet(k) for a in addrs):
            continue
        write_state(Path(cfg.state_dir) / f"{k}.json", {"k": k, "prefix": cfg.prefix, "owner": _owner(False)})
        return k
    raise RuntimeError("no free /24 left in 198.18.0.0/15 for test hosts")


def _names_of(prefix: str, k: int, names: set[str]) -> set[str]:
    """The names among `names` that set k of this prefix would use (bridge, namespaces, veths)."""
    return {n for n in names if re.fullmatch(rf"{prefix}{k}(br|[hv]\d+)", n)}


def _teardown(prefix: str, k: int, namespaces: list[str], veths: list[str]) -> None:
    """Everything of set k: what runs in its namespaces (killed until none is left), the namespaces, the
    veths (deleted here: a namespace is released asynchronously, and its veth pair with it) and the bridge."""
    for ns in namespaces:
        host = Host(0, ns, "")
        deadline = time.monotonic() + 10
        while (pids := host.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)
    for veth in veths:
        _ip("link", "del", veth, check=False)
    _ip("link", "del", f"{prefix}{k}br", check=False)


def _teardown_recorded(state: dict) -> None:
    prefix, k = state["prefix"], int(state["k"])
    # A record made while claiming has no hosts yet: whatever namespaces and veths of that set exist go too.
    spaces = {h["netns"] for h in state.get("hosts", [])} | {n for n in _names_of(prefix, k, _netns())}
    veths = {n for n in _names_of(prefix, k, _links()) if not n.endswith("br")}
    _teardown(prefix, k, sorted(spaces), sorted(veths))


def reap_stale(cfg: HostsConfig | None = None, locked: bool = False) -> list[int]:
    """Remove the sets whose owner has died (a test run killed -9). Sets made from the command line
    (no owner) stay until `flywheel hosts down`."""
    cfg = cfg or HostsConfig()
    with contextlib.nullcontext() if locked else _locked(cfg):
        reaped = []
        for path in sorted(Path(cfg.state_dir).glob("*.json")):
            state = read_state(path)
            if state is None or state.get("owner") is None or same_process(state["owner"]):
                continue
            _teardown_recorded(state)
            path.unlink(missing_ok=True)
            log.warning("removed test hosts %s: their owner (pid %s) is gone", state["k"], state["owner"].get("pid"))
            reaped.append(int(state["k"]))
        return reaped


def recorded(cfg: HostsConfig | None = None) -> list[dict]:
    cfg = cfg or HostsConfig()
    d = Path(cfg.state_dir)
    return [s for p in sorted(d.glob("*.json")) if (s := read_state(p)) is not None] if d.exists() else []


def in_use(state: dict) -> bool:
    """Whether a recorded set's owner is alive (a test run using it now)."""
    return state.get("owner") is not None and same_process(state["owner"])


def down_recorded(k: int, cfg: HostsConfig | None = None, force: bool = False) -> bool:
    """`flywheel hosts down K`: remove a recorded set. One whose owner is alive only with force."""
    cfg = cfg or HostsConfig()
    with _locked(cfg):
        path = Path(cfg.state_dir) / f"{k}.json"
        state = read_state(path)
        if state is None:
            return False
        if in_use(state) and not force:
            raise RuntimeError(f"test hosts {k} belong to a running process (pid {state['owner']['pid']}); --force")
        _teardown_recorded(state)
        path.unlink(missing_ok=True)
        return True
