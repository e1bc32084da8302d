"""A whole fleet on this machine, for `flywheel demo` and `flywheel loadtest`: a Kafka broker, a weight
store (signing keys, v0 = the model, its HTTP server), SGLang replicas on CPU, the gateway, and one weight
agent per replica following the `weights` topic. Everything lives under one directory and every process
started here is stopped here, by PID.

The broker is secured (flywheel.kafka.security): each process started here logs in as its role (kafka_env), and
this process, which launched the broker, is its operator (`admin`) while the fleet runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from admin_api import tokens as admin_tokens
from admin_api.client import AdminClient
from contracts import replica_keys
from infra import kafka_auth
from infra.config import check_modes
from infra.paths import REPO_ROOT
from infra.procs import free_port, in_netns, spawn, stop_pid, tail, wait_until
from weight_sync import fleet_credential
from weight_sync.agent.switch import SwitchMode


@dataclass
class LocalFleetConfig:
    model: Path
    out_dir: Path
    replicas: int = 2
    threads: int = 1  # per replica: replicas sharing the cores must split them (docs/weight-sync.md)
    max_total_tokens: int = 65536  # the KV pool of each replica: a 32k-token agent prompt fits beside others
    switch_mode: SwitchMode = "drain"
    tenants: int = 8  # API keys made for simulated users: tenant-0 .. tenant-{n-1}
    # An agent session waiting this long for tool results is abandoned (serving.signals.implicit): the simulated
    # users walk away at once, so a short wait shows it within the demo's minutes (a person's default is 600 s)
    abandon_after_s: float = 30.0
    admin_token: str = field(default_factory=lambda: "fw-admin-" + secrets.token_hex(8))

    def __post_init__(self):
        check_modes(self)


class LocalFleet:
    def __init__(self, cfg: LocalFleetConfig, say=print):
        self.cfg = cfg
        self.out = Path(cfg.out_dir).resolve()
        self.say = say
        self.keys = {f"tenant-{i}": "fw-" + secrets.token_hex(12) for i in range(cfg.tenants)}
        # The replicas' two keys (contracts.replica_keys): the gateways hold the inference key; each
        # replica's admin key only its weight agent (which reads the replica's version with the other).
        self.replica_key = replica_keys.new_key("inference")
        # The admin API's token split by capability (admin_api.tokens): agents hold the weights part only;
        # cfg.admin_token (all of them) stays with the fleet's operator (env(): status, load tests, the demo).
        self.admin_parts = {cap: f"fw-admin-{cap}-{secrets.token_hex(8)}" for cap in admin_tokens.CAPABILITIES}
        self.replica_admin_keys: dict[str, str] = {}
        # The fleet read credential (weight_sync.fleet_credential): the store server and every agent (which
        # fetches, and whose relay checks its peers with it) hold it; nobody else reads versions.
        self.store_token = fleet_credential.new()
        # Once started: a flywheel.kafka.broker.Broker and a serving.gateway_process.GatewayProcess (HostFleet: a
        # Kafka cluster and the balancer), None before; Any, as each kind of fleet has its own.
        self.broker: Any = None
        self._operator = contextlib.ExitStack()  # this process's Kafka login while the broker runs
        self.replicas: list = []
        self.gateway: Any = None
        self.store_pid: int | None = None
        self.store_url: str | None = None
        self.agent_pids: dict[str, int] = {}
        self.relay_ports: dict[str, int] = {}
        self.agent_metrics: dict[str, str] = {}  # agent name -> host:port of its /metrics (flywheel.observe.prometheus)
        self.store_root = self.out / "weights" / "store"
        self.signing_key = self.out / "weights" / "keys" / "signing.pem"
        self.public_key = self.out / "weights" / "keys" / "signing.pub"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "LocalFleet":
        from serving import gateway_process
        from serving.replica.process import ReplicaConfig, start as start_replica
        from weight_sync.manifest import generate_key
        from weight_sync.publish import activate, publish

        self.out.mkdir(parents=True, exist_ok=True)
        # The replicas load while the broker starts and v0 is published (they need neither until they serve).
        t = time.monotonic()
        rcfg = ReplicaConfig(
            model_path=self.cfg.model,
            log_dir=self.out / "logs",
            threads=self.cfg.threads,
            max_total_tokens=self.cfg.max_total_tokens,
        )
        for i in range(self.cfg.replicas):
            self.replicas.append(start_replica(self.keyed(rcfg, f"r{i}"), wait=False))
        self.start_broker()
        if not self.signing_key.exists():
            generate_key(self.signing_key, self.public_key)
        if not self.store_root.exists() or not any(self.store_root.glob("v*")):
            publish(self.cfg.model, self.publish_config(kafka=False))
        self.store_url = self._spawn_store()
        activate(self.publish_config(), 0, "fleet start: serve v0")
        for i, rep in enumerate(self.replicas):
            rep.ready(rcfg.start_timeout_s)
            self.say(f"sglang  r{i} {rep.url}  (pid {rep.pid}, ready in {time.monotonic() - t:.1f}s)")
        self.gateway = gateway_process.start(
            [r.url for r in self.replicas],
            self.cfg.model,
            self.out / "gateway",
            kafka=self.broker.bootstrap,
            keys=self.keys,
            admin_token=self.cfg.admin_token,
            extra_args=["--abandon-after-s", str(self.cfg.abandon_after_s)],
            env=self.gateway_env(),
        )
        self.say(f"gateway {self.gateway.url}  (pid {self.gateway.pid}; OpenAI API at {self.gateway.url}/v1)")
        for i, rep in enumerate(self.replicas):
            self.agent_pids[f"r{i}"] = self._spawn_agent(f"r{i}", rep.url)
        self.say(
            f"agents  {', '.join(f'r{i}' for i in range(len(self.replicas)))} follow the weights topic "
            f"(store {self.store_url})"
        )
        return self

    def stop(self) -> None:
        for pid in self.agent_pids.values():
            stop_pid(pid)
        self.agent_pids.clear()
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        with ThreadPoolExecutor(max(1, len(self.replicas))) as pool:  # each waits for its process tree to end
            list(pool.map(lambda rep: rep.stop(), self.replicas))
        self.replicas.clear()
        if self.store_pid is not None:
            stop_pid(self.store_pid)
            self.store_pid = None
        self.stop_broker()

    def start_broker(self) -> None:
        from flywheel.kafka import broker as kafka_broker
        from infra.kafka_admin import ensure_topics

        t = time.monotonic()
        self.broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=self.out / "kafka"))
        self._operator.enter_context(kafka_auth.acting_as(self.kafka_env("admin")))
        ensure_topics(self.broker.bootstrap)
        self.say(f"kafka   {self.broker.bootstrap}  (pid {self.broker.pid}, ready in {time.monotonic() - t:.1f}s)")

    def stop_broker(self) -> None:
        from flywheel.kafka import broker as kafka_broker

        # The broker of this data dir now: a scenario may have stopped ours and started another.
        current = kafka_broker.running(self.out / "kafka")
        for b in {id(x): x for x in (current, self.broker) if x is not None}.values():
            b.stop()
        self._operator.close()

    # ------------------------------------------------------------------ helpers
    def publish_config(self, kafka: bool = True):
        from weight_sync.publish import PublishConfig

        return PublishConfig(
            store=self.store_root,
            private_key=self.signing_key,
            kafka_bootstrap=self.broker.bootstrap if kafka else None,
            store_url=self.store_url,
        )

    def kafka_env(self, role: str) -> dict[str, str]:
        """The Kafka login of a process acting as `role` here (infra.kafka_auth)."""
        return self.broker.client_env(role)

    def env(self) -> dict[str, str]:
        """What a process working against this fleet needs (the flywheel CLI reads these)."""
        return {
            **self.kafka_env("admin"),  # the operator's: rollbacks, audits, load-test checks
            "FLYWHEEL_GATEWAY_URL": self.gateway.url,
            "FLYWHEEL_ADMIN_TOKEN": self.cfg.admin_token,
            "FLYWHEEL_KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "FLYWHEEL_STORE_URL": self.store_url or "",
            fleet_credential.ENV: self.store_token,  # `flywheel status` lists the store's versions with it
            "FLYWHEEL_WEIGHTS_STORE": str(self.store_root),
            "FLYWHEEL_SIGNING_KEY": str(self.signing_key),
            "FLYWHEEL_PUBLIC_KEY": str(self.public_key),  # what agents verify versions with
            "FLYWHEEL_AGENT_METRICS": ",".join(f"{n}={a}" for n, a in sorted(self.agent_metrics.items())),
            "FLYWHEEL_LOADTEST_KEYS": ",".join(self.keys.values()),
        }

    def keyed(self, rcfg, name: str):
        """rcfg with replica `name`'s keys (its admin key made on first use, kept across its restarts)."""
        admin = self.replica_admin_keys.setdefault(name, replica_keys.new_key("admin"))
        return dataclasses.replace(rcfg, api_key=self.replica_key, admin_api_key=admin)

    def replica_env(self, name: str) -> dict[str, str]:
        """The keys of replica `name` (the fleet's inference key, its own admin key): what an SRE restarting that
        replica or its agent needs in the shell (docs/runbooks: ReplicaDown, AgentRejectedVersion)."""
        return replica_keys.env(self.replica_key, self.replica_admin_keys[name])

    def gateway_env(self, **more: str) -> dict[str, str]:
        """A gateway's environment entries: the replicas' inference key (never an admin key) and the admin API's
        tokens by capability (the operator's token, all of them, goes by gateway_process's admin_token)."""
        parts = {admin_tokens.ENV[cap]: token for cap, token in self.admin_parts.items()}
        return {**replica_keys.env(self.replica_key), **parts, **self.kafka_env("gateway"), **more}

    @property
    def admin(self) -> AdminClient:
        """The gateway's admin API, with the operator's token."""
        return AdminClient(self.gateway.url, self.cfg.admin_token)

    def served_versions(self) -> dict[str, int | None]:
        return self.admin.weights()["replicas"]

    def wait_fleet_on(self, version: int, timeout_s: float = 180.0) -> float:
        """Block until every replica serves `version`; returns the seconds it took."""
        t = time.monotonic()
        wait_until(
            lambda: set(self.served_versions().values()) == {version},
            timeout_s,
            interval=0.5,
            what=f"every replica on v{version}",
        )
        return time.monotonic() - t

    def store_activations(self) -> list[dict]:
        from weight_sync.store.server import Store

        return Store(self.store_root).activations()

    def switch_reports(self) -> list[dict]:
        out = []
        for name in sorted(self.agent_pids) or [f"r{i}" for i in range(self.cfg.replicas)]:
            f = self.out / "agents" / name / "switches.jsonl"
            if f.exists():
                out += [{"replica": name, **json.loads(line)} for line in f.read_text().splitlines() if line]
        return out

    def gateway_urls(self) -> list[str]:
        """Every gateway routing to the replicas (each drains a replica during its switch)."""
        return [self.gateway.url]

    def _python(
        self, args: list[str], log_name: str, netns: str | None = None, secret_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """`python -m flywheel args` in the fleet's environment; secrets go in the child's environment, never in
        its argv (which every `ps` on the machine shows: DESIGN, Trust)."""
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "flywheel", *args]
        with open(self.out / "logs" / log_name, "ab") as log:
            return spawn(
                in_netns(netns, cmd),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**_child_env(), **(secret_env or {})},
            )

    def _spawn_store(self, port: int = 0, host: str = "127.0.0.1", netns: str | None = None) -> str:
        port = port or free_port(host)
        proc = self._python(
            ["weights", "serve", "--store", str(self.store_root), "--host", host, "--port", str(port)],
            "store.log",
            netns,
            secret_env={fleet_credential.ENV: self.store_token},
        )
        self.store_pid = proc.pid
        url = f"http://{host}:{port}"

        def up() -> bool:
            try:
                urllib.request.urlopen(f"{url}/versions", timeout=2).close()
                return True
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False

        wait_until(up, 30, interval=0.2, what="weight store server", alive=lambda: proc.poll() is None)
        return url

    def _spawn_agent(
        self, name: str, replica_url: str, netns: str | None = None, relay_host: str = "127.0.0.1", relay_port: int = 0
    ) -> int:
        """An agent for one replica, with its relay (peers fetch the pieces it verified: the store sends each
        version about once) on relay_host, at relay_port or a free one. A restarted agent keeps its port, so
        the store's note that it holds a version's pieces stays true."""
        relay_port = relay_port or self.relay_ports.get(name) or free_port(relay_host)
        self.relay_ports[name] = relay_port
        # Also kept across restarts: Prometheus scrapes the address it was given. A host in a network namespace
        # has its own ports: the one after the relay's is free there (this namespace cannot probe it).
        metrics = self.agent_metrics.get(name) or f"{relay_host}:{relay_port + 1 if netns else free_port(relay_host)}"
        self.agent_metrics[name] = metrics
        assert self.store_url is not None, "start() spawns the store first"
        proc = self._python(
            [
                "weights",
                "agent",
                "--name",
                name,
                "--replica",
                replica_url,
                "--store-url",
                self.store_url,
                "--public-key",
                str(self.public_key),
                "--initial-model",
                str(self.cfg.model),
                "--work-dir",
                str(self.out / "agents" / name),
                "--kafka",
                self.broker.bootstrap,
                "--gateway",
                ",".join(self.gateway_urls()),
                "--switch-mode",
                self.cfg.switch_mode,
                "--relay-host",
                relay_host,
                "--relay-port",
                str(relay_port),
                "--metrics-host",
                relay_host,
                "--metrics-port",
                metrics.rsplit(":", 1)[1],
            ],
            f"agent-{name}.log",
            netns,
            secret_env={
                "FLYWHEEL_ADMIN_TOKEN": self.admin_parts["weights"],
                **replica_keys.env(self.replica_key, self.replica_admin_keys[name]),
                fleet_credential.ENV: self.store_token,
                **self.kafka_env("agent"),
            },
        )
        time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"agent {name} exited at once:\n{tail(self.out / 'logs' / f'agent-{name}.log')}")
        return proc.pid


def _child_env() -> dict[str, str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    stale = ("FLYWHEEL_KAFKA_BOOTSTRAP", "FLYWHEEL_GATEWAY_URL", "FLYWHEEL_ADMIN_TOKEN", fleet_credential.ENV)
    for k in (*stale, *replica_keys.env(None), *admin_tokens.ENV.values(), *kafka_auth.env(None)):
        env.pop(k, None)  # children get this fleet's values (by flag, a secret by its own env), never a stale shell's
    return env
