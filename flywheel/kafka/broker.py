"""A real Apache Kafka 4 broker (KRaft: broker and controller in one JVM): a single node on loopback, or
one node of a cluster on a test host (flywheel.kafka.cluster: a static quorum of voters, topics replicated).

The jars come from Maven Central through the small Maven project beside this file and are cached
under $FLYWHEEL_HOME/kafka/<version>/libs. The broker keeps its pid, ports and log under a data dir;
`start` returns only once the broker answers metadata requests.

Secure by default (flywheel.kafka.security): SCRAM logins, an ACL per role, TLS; the credentials are made at the
first format, under <data dir>/security, and Broker.client_env(role) is what a process acting as a role gets.
`secure=False` formats an open broker (PLAINTEXT, no authorizer), for comparing what security costs.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from flywheel.kafka.security import Security, apply_acls, create_security, format_args, load_security, server_properties
from infra import kafka_auth
from infra.config import option
from infra.kafka_admin import quiet_kafka
from infra.maven import resolve_jars
from infra.paths import flywheel_home
from infra.procs import (
    free_port,
    identity,
    in_netns,
    read_state,
    same_process,
    spawn,
    stop_recorded,
    tail,
    wait_until,
    write_state,
)

POM = Path(__file__).resolve().parent / "maven" / "pom.xml"
STATE_FILE = "broker.json"  # present while a broker runs
PORTS_FILE = "ports.json"  # kept: the ports the data dir was formatted with
SECURITY_DIR_ENV = "FLYWHEEL_KAFKA_SECURITY_DIR"


def pinned_version() -> str:
    """The Kafka version pinned in the Maven project (the one place it is written)."""
    m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    assert m, f"no kafka.version property in {POM}"
    return m.group(1)


@dataclass
class BrokerConfig:
    data_dir: Path = option(default_factory=lambda: flywheel_home() / "kafka-data", help="the broker's data directory")
    port: int = option(0, help="client port (0: a free one)")
    controller_port: int = 0
    heap: str = option("512m", help="the broker JVM's heap (-Xmx)")
    num_partitions: int = 4
    start_timeout_s: float = 120.0
    # One node of a cluster (flywheel.kafka.cluster): its address, id, the quorum's voters
    # ("1@host:port,2@host:port,..."), the replication of internal topics, and the namespace it runs in.
    host: str = option("127.0.0.1", help="address to listen on and advertise")
    node_id: int = 1
    voters: str | None = None  # None: a standalone controller (formatted with --standalone)
    cluster_id: str | None = None  # shared by a cluster's nodes (a standalone node draws its own)
    replication: int = 1
    min_insync: int = 1
    netns: str | None = None
    secure: bool = True  # SCRAM logins and ACLs (flywheel.kafka.security); a formatted data dir keeps its choice
    tls: bool = True  # ... over TLS (benchmarks.kafka_security measures what it costs)
    # Where the credentials and CA live: brokers started with one share its principals (a cluster's nodes; every
    # broker of a test session). None: $FLYWHEEL_KAFKA_SECURITY_DIR, else <data_dir>/security.
    security_dir: Path | None = None


@dataclass
class Broker:
    pid: int
    bootstrap: str
    data_dir: Path
    log_file: Path
    security: Security | None = None  # None: an open broker

    def stop(self, timeout: float = 30.0) -> bool:
        return stop_recorded(self.pid, self.data_dir / STATE_FILE, timeout)

    def client_env(self, role: str) -> dict[str, str]:
        """The environment of a process that talks to this broker as `role` (infra.kafka_auth)."""
        return self.security.client_env(role) if self.security else kafka_auth.env(None)

    def client_config(self, role: str) -> dict:
        """kafka-python's keyword arguments for `role` ({} on an open broker)."""
        return self.security.client_config(role) if self.security else {}


def libs_dir(version: str | None = None) -> Path:
    return flywheel_home() / "kafka" / (version or pinned_version()) / "libs"


def fetch_jars(quiet: bool = False) -> Path:
    """Resolve the broker and its runtime classpath with mvn into the cache (once)."""
    version = pinned_version()
    return resolve_jars(POM, libs_dir(version), f"Kafka {version}", "kafka_2.13-", quiet)


def new_cluster_id() -> str:
    # Kafka's Uuid text form: url-safe base64 of 16 bytes, no padding. One that starts with "-" reads as
    # an option to kafka-storage's argument parser (1 in 64: it failed a demo run): draw again.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _open_listeners(h: str, port: int, cport: int) -> str:
    return f"""\
listeners=PLAINTEXT://{h}:{port},CONTROLLER://{h}:{cport}
advertised.listeners=PLAINTEXT://{h}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
"""


def _server_properties(cfg: BrokerConfig, port: int, cport: int, log_dirs: Path, sec: Security | None) -> str:
    h, rf, isr = cfg.host, cfg.replication, cfg.min_insync
    quorum = (
        f"controller.quorum.voters={cfg.voters}" if cfg.voters else f"controller.quorum.bootstrap.servers={h}:{cport}"
    )
    listeners = server_properties(sec, h, port, cport) if sec else _open_listeners(h, port, cport)
    return f"""\
process.roles=broker,controller
node.id={cfg.node_id}
{quorum}
{listeners.rstrip()}
log.dirs={log_dirs}
num.partitions={cfg.num_partitions}
default.replication.factor={rf}
min.insync.replicas={isr}
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=168
"""


_LOG4J2 = """\
Configuration:
  Appenders:
    File:
      name: broker
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: broker
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
"""


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: Kafka 4 needs Java 17 or newer")
    return java


def metadata_ok(bootstrap: str, timeout_s: float = 5.0, login: dict | None = None) -> bool:
    """True when the broker answers a metadata request (and reports itself as a live node); False while its
    port is closed; raises (kafka-python's timeout) when it accepts but does not answer. Within about twice
    timeout_s (bootstrap, then the request): kafka-python alone would go on bootstrapping for 30 s, its
    reconnect backoff doubling, so a probe begun just before a broker opened its port answered half a minute
    later (a restarted cluster node: ready in ~10 s, seen after 30). The port is tried first because an admin
    client whose bootstrap fails raises from its constructor with its I/O thread left running. `login`: the
    client's keyword arguments for a secured broker (default: this process's principal, kafka_auth)."""
    import socket

    from kafka import KafkaAdminClient

    host, port = bootstrap.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    ms = int(timeout_s * 1000)
    with quiet_kafka():  # "connection refused" is the expected answer while a broker starts
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=ms,
            bootstrap_timeout_ms=ms,
            reconnect_backoff_max_ms=min(ms, 500),
            client_id="flywheel-probe",
            **(kafka_auth.client_config() if login is None else login),
        )
        try:
            return len(admin.describe_cluster().get("brokers", [])) >= 1
        finally:
            admin.close()


def running(data_dir: Path) -> Broker | None:
    """The broker recorded in data_dir, if its process is alive."""
    state = read_state(Path(data_dir) / STATE_FILE)
    if not state or not same_process(state):
        return None
    security = load_security(Path(state["security_dir"])) if state.get("security_dir") else None
    return Broker(
        pid=state["pid"],
        bootstrap=state["bootstrap"],
        data_dir=Path(data_dir),
        log_file=Path(state["log_file"]),
        security=security,
    )


def start(cfg: BrokerConfig | None = None, die_with_parent: bool = True, wait: bool = True) -> Broker:
    """Start (formatting on first use) a KRaft broker+controller; wait until it serves metadata (a cluster's
    nodes are started with wait=False: none serves before a majority of the voters is up)."""
    cfg = cfg or BrokerConfig()
    data_dir = Path(cfg.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = running(data_dir)
    if existing is not None:
        raise RuntimeError(
            f"a broker is already running from {data_dir} (pid {existing.pid}, {existing.bootstrap}); stop it first"
        )
    if cfg.netns and not (cfg.port and cfg.controller_port):
        raise ValueError("a broker in a namespace needs its ports given (free ports are probed here, outside it)")
    libs = fetch_jars(quiet=True)
    log_dirs = data_dir / "logs"
    formatted = (log_dirs / "meta.properties").exists()
    # A formatted standalone controller has its endpoint in the metadata log: a restart keeps its ports.
    previous = (read_state(data_dir / PORTS_FILE) or {}) if formatted else {}
    port = cfg.port or previous.get("port") or free_port(cfg.host)
    cport = cfg.controller_port or previous.get("controller_port") or free_port(cfg.host)
    while cport == port:
        cport = free_port(cfg.host)
    sec = _security(cfg, data_dir, previous if formatted else None)
    props = data_dir / "server.properties"
    props.touch(mode=0o600)
    os.chmod(props, 0o600)  # before it holds the nodes' own password
    props.write_text(_server_properties(cfg, port, cport, log_dirs, sec))
    log_file = data_dir / "broker.log"
    log4j = data_dir / "log4j2.yaml"
    log4j.write_text(_LOG4J2.format(log=log_file))
    classpath = f"{libs}/*"
    java = _java()
    # C1 only: the broker starts in ~3 s instead of ~9 s; at our event rates it made no measurable
    # difference to gateway latency (benchmarks.gateway, run with and without).
    jvm = [
        java,
        f"-Xms{cfg.heap}",
        f"-Xmx{cfg.heap}",
        "-XX:+UseG1GC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath,
    ]

    if not formatted:
        # A cluster's nodes share one id and list their voters in server.properties (a static quorum).
        if cfg.voters and not cfg.cluster_id:
            raise ValueError("a cluster node needs the cluster's id (BrokerConfig.cluster_id)")
        how = ["-t", cfg.cluster_id] if cfg.voters else ["--standalone", "-t", cfg.cluster_id or new_cluster_id()]
        tool = ["kafka.tools.StorageTool", "format", *how, *(format_args(sec) if sec else []), "-c", str(props)]
        # The tool takes the SCRAM passwords as arguments: they go in a java argument file of mode 0600, so
        # that the command line any process can read names only that file.
        argfile = data_dir / "format.args"
        argfile.touch(mode=0o600)
        os.chmod(argfile, 0o600)
        argfile.write_text("\n".join(f'"{_argfile_quote(a)}"' for a in tool) + "\n")
        try:
            fmt = subprocess.run(jvm + [f"@{argfile}"], capture_output=True, text=True)
        finally:
            argfile.unlink()
        if fmt.returncode != 0:
            raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
    write_state(
        data_dir / PORTS_FILE,
        {"port": port, "controller_port": cport, "security_dir": str(sec.dir) if sec else None},
    )

    stdout = open(data_dir / "broker.stdout", "ab")
    cmd = jvm + ["kafka.Kafka", str(props)]
    proc = spawn(
        in_netns(cfg.netns, cmd),
        die_with_parent=die_with_parent,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=data_dir,
    )
    stdout.close()
    bootstrap = f"{cfg.host}:{port}"
    broker = Broker(pid=proc.pid, bootstrap=bootstrap, data_dir=data_dir, log_file=log_file, security=sec)
    write_state(
        data_dir / STATE_FILE,
        {
            **identity(proc.pid),
            "bootstrap": bootstrap,
            "port": port,
            "controller_port": cport,
            "log_file": str(log_file),
            "security_dir": str(sec.dir) if sec else None,
            "version": pinned_version(),
            "started": time.time(),
        },
    )
    if not wait:
        return broker
    try:
        wait_until(
            lambda: metadata_ok(bootstrap, 3.0, broker.client_config("admin")),
            cfg.start_timeout_s,
            interval=0.5,
            what=f"Kafka broker on {bootstrap}",
            alive=lambda: proc.poll() is None,
        )
    except (TimeoutError, RuntimeError) as e:
        broker.stop()
        raise RuntimeError(
            f"{e}\n--- broker.stdout ---\n{tail(data_dir / 'broker.stdout')}\n--- broker.log ---\n{tail(log_file)}"
        ) from None
    if sec and not cfg.voters:  # a cluster's ACLs are applied once all its nodes serve (flywheel.kafka.cluster)
        try:
            apply_acls(bootstrap, sec)
        except BaseException:
            broker.stop()
            raise
    return broker


def _argfile_quote(arg: str) -> str:
    """An argument as a java @-file writes it inside double quotes (backslash escapes apply there)."""
    return arg.replace("\\", "\\\\").replace('"', '\\"')


def _security(cfg: BrokerConfig, data_dir: Path, formatted: dict | None) -> Security | None:
    """The data dir's security material: made (or taken from a shared directory) before its first format when
    cfg.secure; a formatted data dir keeps what it was formatted with, as its PORTS_FILE (`formatted`) names it:
    its credentials are in its metadata."""
    if formatted is not None:
        if not formatted.get("security_dir"):
            if cfg.secure:
                raise RuntimeError(
                    f"{data_dir} was formatted without credentials (an open broker, or one formatted before Kafka "
                    "authentication): start it with secure=False, or remove the data dir to format a secured one"
                )
            return None
        sec = load_security(Path(formatted["security_dir"]))
        if sec is None:
            raise RuntimeError(f"{data_dir} was formatted with the credentials in {formatted['security_dir']}: gone")
        return sec
    if not cfg.secure:
        return None
    where = Path(cfg.security_dir or os.environ.get(SECURITY_DIR_ENV) or data_dir / "security")
    return load_security(where) or create_security(where, tls=cfg.tls)
