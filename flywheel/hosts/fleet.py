"""A fleet laid over test hosts (flywheel.hosts.netns): what runs where when Flywheel outgrows one machine.

    host 0: Kafka node 1, weight store :8100, HAProxy :8080 (what clients reach), replica r0 :30000 + agent
    host 1: Kafka node 2, gateway g0 :8000,                                        replica r1 :30001 + agent
    host 2: Kafka node 3, gateway g1 :8001,                                        replica r2 :30002 + agent
    host i (i >= 3):                                                               replica ri :3000i + agent
    every host: its agent's relay :8200 (agents fetch a version's pieces from each other)

Every process binds its own host's address and reaches its peers by theirs: the gateways take every
replica and all three brokers, the agents their own replica, the store on host 0, every gateway (a
replica is drained on each during a switch) and the brokers. The gateways share the id-signing secret,
so feedback for a completion one of them issued is taken by the other. Each gateway keeps its own spool.
Ports differ per host so that the replicas' pid files (machine-wide, keyed by port) do not collide; two
fleets over hosts at once would still collide there (the tests run one at a time).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from flywheel.local_fleet import LocalFleet, LocalFleetConfig
from infra import kafka_auth
from infra.procs import kill_group_now, wait_until

STORE_PORT = 8100
GATEWAY_PORT = 8000  # + j
REPLICA_PORT = 30000  # + i, below the kernel's ephemeral range
LB_PORT = 8080
RELAY_PORT = 8200  # each agent's relay, on its own host's address: peers fetch from each other across hosts


@dataclass
class HostFleetConfig(LocalFleetConfig):
    hosts: int = 3  # replicas: one per host
    gateways: int = 2  # on hosts 1 .. gateways
    rate_mbit: float | None = None  # shape every host's link (tbf)
    id_secret: str = field(default_factory=lambda: secrets.token_hex(32))

    def __post_init__(self):
        super().__post_init__()
        if self.hosts < 3:
            raise ValueError("a fleet over hosts needs at least 3 (three Kafka nodes)")
        if not 1 <= self.gateways < self.hosts:
            raise ValueError(f"gateways go on hosts 1..{self.hosts - 1}: 1 to {self.hosts - 1} of them")
        self.replicas = self.hosts


class HostFleet(LocalFleet):
    """LocalFleet's parts, each on its host. `self.gateway` is the balancer (clients' entry point);
    `self.gateways` the gateway processes behind it; `self.broker` the Kafka cluster."""

    cfg: HostFleetConfig

    def __init__(self, cfg: HostFleetConfig, say=print):
        super().__init__(cfg, say)
        self.test_hosts: Any = None  # a TestHosts once started
        self.gateways: list = []

    @property
    def hosts(self):
        return self.test_hosts.hosts

    def start(self) -> HostFleet:
        from flywheel.hosts.netns import HostsConfig, TestHosts
        from serving.replica.process import ReplicaConfig, start as start_replica
        from weight_sync.manifest import generate_key
        from weight_sync.publish import activate, publish

        self.out.mkdir(parents=True, exist_ok=True)
        self.test_hosts = TestHosts.up(HostsConfig(n=self.cfg.hosts, rate_mbit=self.cfg.rate_mbit))
        self.say("hosts   " + ", ".join(f"{h.netns}={h.addr}" for h in self.hosts))
        t = time.monotonic()
        for i, h in enumerate(self.hosts):  # launched together, they load side by side and while the brokers start
            rcfg = ReplicaConfig(
                model_path=self.cfg.model,
                host=h.addr,
                port=REPLICA_PORT + i,
                netns=h.netns,
                log_dir=self.out / "logs",
                threads=self.cfg.threads,
                max_total_tokens=self.cfg.max_total_tokens,
            )
            self.replicas.append(start_replica(self.keyed(rcfg, f"r{i}"), wait=False))
        self.start_broker()
        if not self.signing_key.exists():
            generate_key(self.signing_key, self.public_key)
        if not self.store_root.exists() or not any(self.store_root.glob("v*")):
            publish(self.cfg.model, self.publish_config(kafka=False))
        h0 = self.hosts[0]
        self.store_url = self._spawn_store(STORE_PORT, h0.addr, h0.netns)
        activate(self.publish_config(), 0, "fleet start: serve v0")
        for i, rep in enumerate(self.replicas):
            rep.ready(ReplicaConfig.start_timeout_s)
            self.say(f"sglang  r{i} {rep.url}  (pid {rep.pid}, ready after {time.monotonic() - t:.1f}s)")
        for j in range(self.cfg.gateways):
            self.gateways.append(self._start_gateway(j))
        self._start_balancer()
        for i, (h, rep) in enumerate(zip(self.hosts, self.replicas, strict=True)):
            self.agent_pids[f"r{i}"] = self._spawn_agent(f"r{i}", rep.url, h.netns, h.addr, RELAY_PORT)
        self.say(f"agents  r0..r{len(self.replicas) - 1} follow the weights topic (store {self.store_url})")
        return self

    def stop(self) -> None:
        for g in self.gateways:  # the balancer, agents, replicas, store and brokers: LocalFleet's stop
            if g is not None:
                g.stop()
        self.gateways.clear()
        try:
            super().stop()
        finally:
            if self.test_hosts is not None:
                self.test_hosts.down()  # and whatever still ran inside
                self.test_hosts = None

    # ------------------------------------------------------------------ parts
    def start_broker(self) -> None:
        from flywheel.kafka import cluster as kafka_cluster
        from infra.kafka_admin import ensure_topics

        t = time.monotonic()
        self.broker = kafka_cluster.start(self.hosts[:3], kafka_cluster.ClusterConfig(data_root=self.out / "kafka"))
        self._operator.enter_context(kafka_auth.acting_as(self.kafka_env("admin")))
        ensure_topics(self.broker.bootstrap)
        self.say(f"kafka   {self.broker.bootstrap}  (3 nodes, ready in {time.monotonic() - t:.1f}s)")

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        self._operator.close()

    def gateway_host(self, j: int):
        return self.hosts[1 + j]

    def _start_gateway(self, j: int):
        from serving import gateway_process

        h = self.gateway_host(j)
        gw = gateway_process.start(
            [r.url for r in self.replicas],
            self.cfg.model,
            self.out / f"gateway{j}",
            kafka=self.broker.bootstrap,
            keys=self.keys,
            admin_token=self.cfg.admin_token,
            port=GATEWAY_PORT + j,
            host=h.addr,
            netns=h.netns,
            env=self.gateway_env(FLYWHEEL_ID_SECRET=self.cfg.id_secret),
        )
        self.say(f"gateway g{j} {gw.url}  (pid {gw.pid}, on {h.netns})")
        return gw

    def _start_balancer(self) -> None:
        from flywheel.hosts import haproxy

        h0 = self.hosts[0]
        self.gateway = haproxy.start(
            haproxy.HaproxyConfig(
                backends=[g.url for g in self.gateways],
                state_dir=self.out / "haproxy",
                host=h0.addr,
                port=LB_PORT,
                netns=h0.netns,
            )
        )
        self.say(f"haproxy {self.gateway.url}  (pid {self.gateway.pid}) -> {', '.join(self.gateway_urls())}")

    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.gateways if g is not None]

    def spawn_trainer(self, work_dir, *flags: str):
        """`flywheel train` on host 0, reading the cluster and publishing to the store (no rollouts)."""
        h0 = self.hosts[0]
        args = ["train", "--model", str(self.cfg.model), "--work-dir", str(work_dir), "--kafka", self.broker.bootstrap]
        args += ["--store", str(self.store_root), "--key", str(self.signing_key), "--store-url", self.store_url]
        return self._python([*args, *flags], "trainer.log", h0.netns, secret_env=self.kafka_env("trainer"))

    # ------------------------------------------------------------------ faults
    def kill_gateway(self, j: int) -> None:
        """kill -9 gateway j and its group (what it had in flight is lost; what it answered is on disk)."""
        kill_group_now(self.gateways[j].pid)
        self.gateways[j] = None

    def restart_gateway(self, j: int) -> None:
        """Gateway j again on its host, port and state dir: its spool ships what the dead one left."""
        self.gateways[j] = self._start_gateway(j)

    def balancer_sees(self, j: int, status: str, timeout_s: float = 30.0) -> None:
        wait_until(
            lambda: self.gateway.servers()[f"gw{j}"]["status"] == status, timeout_s, what=f"haproxy: gw{j} {status}"
        )
