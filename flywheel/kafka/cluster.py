"""A Kafka 4 cluster over test hosts: one KRaft node (broker and controller) per host, a static quorum of
voters, topics replicated three ways with min.insync.replicas=2, so one broker can die under load and
nothing acknowledged is lost (producers ask for acks=all).

    host i: node i+1  CLIENT <addr>:9092, CONTROLLER <addr>:9093, data <data_root>/node<i+1>

Secured as a single broker is (flywheel.kafka.security), with one set of credentials and one CA under
<data_root>/security (or $FLYWHEEL_KAFKA_SECURITY_DIR), shared by the nodes, each with its own certificate; the
ACLs are applied once all serve.

Each host has its own network namespace, so every node listens on the same ports at its own address.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.hosts.netns import Host
from flywheel.kafka import broker as kb
from infra import kafka_auth
from infra.kafka_admin import quiet_kafka
from infra.procs import kill_group_now, pid_alive, tail, wait_until


@dataclass
class ClusterConfig:
    data_root: Path
    port: int = 9092
    controller_port: int = 9093
    replication: int = 3
    min_insync: int = 2
    heap: str = "384m"  # three JVMs share this machine
    num_partitions: int = 4
    start_timeout_s: float = 180.0
    secure: bool = True


@dataclass
class Cluster:
    cfg: ClusterConfig
    nodes: list[kb.BrokerConfig]
    brokers: list[kb.Broker | None] = field(default_factory=list)
    security: kb.Security | None = None

    def client_env(self, role: str) -> dict[str, str]:
        """The environment of a process that talks to the cluster as `role` (infra.kafka_auth)."""
        return self.security.client_env(role) if self.security else kafka_auth.env(None)

    def _login(self) -> dict:
        return self.security.client_config("admin") if self.security else {}

    @property
    def bootstrap(self) -> str:
        """Every node's address: a client reaches the cluster through whichever answers."""
        return ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    def kill(self, i: int) -> None:
        """kill -9 node i (its JVM and its group)."""
        broker = self.brokers[i]
        assert broker is not None, f"node {i} is not running"
        kill_group_now(broker.pid)
        broker.stop(timeout=5)  # forgets its state file
        self.brokers[i] = None

    def restart(self, i: int) -> kb.Broker:
        """Node i again, same data and ports: it rejoins the quorum and catches its replicas up."""
        self.brokers[i] = broker = kb.start(self.nodes[i])
        return broker

    def stop(self) -> bool:
        """Every node at once: stopped one after another, the last one left has no quorum to approve its
        controlled shutdown and waits for it until killed (30 s a cluster, measured)."""
        running = [b for b in self.brokers if b is not None]
        with ThreadPoolExecutor(max(1, len(running))) as pool:
            ok = all(pool.map(lambda b: b.stop(), running))
        self.brokers = [None] * len(self.nodes)
        return ok

    def broker_ids(self) -> list[int]:
        """The nodes the cluster reports registered and not fenced."""
        from kafka import KafkaAdminClient

        with quiet_kafka():
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="flywheel-cluster", **self._login())
            try:
                return sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced"))
            finally:
                admin.close()

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> its leader's node id."""
        return {p: leader for p, (leader, _) in self._partitions(topic).items()}

    def in_sync(self, topic: str) -> dict[int, list[int]]:
        """partition -> its in-sync replicas."""
        return {p: isr for p, (_, isr) in self._partitions(topic).items()}

    def _partitions(self, topic: str) -> dict[int, tuple[int, list[int]]]:
        from kafka import KafkaAdminClient

        with quiet_kafka():
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="flywheel-cluster", **self._login())
            try:
                (desc,) = admin.describe_topics([topic])
                return {p["partition_index"]: (p["leader_id"], sorted(p["isr_nodes"])) for p in desc["partitions"]}
            finally:
                admin.close()


def start(hosts: list[Host], cfg: ClusterConfig) -> Cluster:
    """One node per host (three or more for replication 3), started together, ready once every node
    serves metadata and the cluster reports them all."""
    if len(hosts) < cfg.replication:
        raise ValueError(f"replication {cfg.replication} needs at least that many hosts, got {len(hosts)}")
    cid = kb.new_cluster_id()
    security_dir = Path(os.environ.get(kb.SECURITY_DIR_ENV) or Path(cfg.data_root) / "security")
    security = None
    if cfg.secure:
        security = kb.load_security(security_dir) or kb.create_security(security_dir)
    voters = ",".join(f"{i + 1}@{h.addr}:{cfg.controller_port}" for i, h in enumerate(hosts))
    nodes = [
        kb.BrokerConfig(
            data_dir=Path(cfg.data_root) / f"node{i + 1}",
            port=cfg.port,
            controller_port=cfg.controller_port,
            heap=cfg.heap,
            num_partitions=cfg.num_partitions,
            start_timeout_s=cfg.start_timeout_s,
            host=h.addr,
            node_id=i + 1,
            voters=voters,
            cluster_id=cid,
            replication=cfg.replication,
            min_insync=cfg.min_insync,
            netns=h.netns,
            secure=cfg.secure,
            security_dir=security_dir,
        )
        for i, h in enumerate(hosts)
    ]
    cluster = Cluster(cfg, nodes, [], security)
    try:
        for n in nodes:  # none answers before a majority of voters is up: start all, then wait
            cluster.brokers.append(kb.start(n, wait=False))
        wait_until(
            lambda: (
                all(kb.metadata_ok(f"{n.host}:{n.port}", 3.0, cluster._login()) for n in nodes)
                and len(cluster.broker_ids()) == len(nodes)
            ),
            cfg.start_timeout_s,
            interval=1.0,
            what=f"Kafka cluster of {len(nodes)} on {cluster.bootstrap}",
            alive=lambda: all(b is not None and pid_alive(b.pid) for b in cluster.brokers),
        )
        if security:
            kb.apply_acls(cluster.bootstrap, security)
    except (TimeoutError, RuntimeError) as e:
        logs = "\n".join(f"--- node {i + 1} ---\n{tail(b.log_file)}" for i, b in enumerate(cluster.brokers) if b)
        cluster.stop()
        raise RuntimeError(f"{e}\n{logs}") from None
    except BaseException:
        cluster.stop()
        raise
    return cluster
