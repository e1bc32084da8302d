"""The agent's configuration, the one source of `flywheel weights agent`'s options (infra.config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infra.config import check_modes, option
from infra.paths import flywheel_home
from weight_sync import fleet_credential
from weight_sync.agent.peer_rate import PeerBound
from weight_sync.agent.relay import RelayConfig
from weight_sync.agent.switch import SwitchMode


@dataclass
class AgentConfig:
    name: str = option(help="agent name (the replica's id in the gateway, e.g. r0)")
    replica_url: str = option(flag="replica", help="replica base URL")
    store_url: str = option(
        help="the store server's URL, or a bucket: s3://BUCKET/PREFIX (endpoint and credentials from AWS_*)"
    )
    initial_model: Path = option(help="the checkpoint the replica started with")
    # None given: filled in by __post_init__, so a built config always holds a Path
    public_key: Path = option(None, help="the trainer's public key (None: $FLYWHEEL_HOME/weights/keys/signing.pub)")
    work_dir: Path = option(None, help="the agent's directory (None: $FLYWHEEL_HOME/weights/agents/NAME)")
    initial_version: int = 0
    kafka_bootstrap: str | None = option(
        None, flag="kafka", env="FLYWHEEL_KAFKA_BOOTSTRAP", help="bootstrap servers of the weights topic"
    )
    gateway_url: str | None = option(
        None,
        flag="gateway",
        env="FLYWHEEL_GATEWAY_URL",
        help="the gateway's URL, or every gateway's, comma-separated (the replica is drained on each)",
    )
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the admin API's credential"
    )  # environment only (DESIGN: Trust)
    gateway_replica_id: str | None = None
    switch_mode: SwitchMode = option("drain", help="how the replica is taken out of traffic while it switches")
    retry_base_s: float = 1.0  # a transient failure (store or replica unreachable) is retried after this,
    retry_max_s: float = 30.0  # doubling up to this; the offset is committed only once it succeeds
    keep_local: int = 3
    parallel_downloads: int = 4
    threads: int = 2
    inplace: bool = option(
        True,
        help="a delta against the served version is applied in place, on the same host (weight_sync.agent.inplace); "
        "--no-inplace: always reload whole checkpoints from disk",
    )
    metrics_port: int = option(0, help="port of /metrics (0: no /metrics server)")
    metrics_host: str = option("127.0.0.1", help="address /metrics listens on")
    # The peer relay (weight_sync.agent.relay): other agents fetch the pieces this one verified from here, so the
    # store sends each version about once. 0: no relay (every piece from the store, as before relays).
    relay_port: int = option(0, help="serve verified pieces to peer agents on this port (0: no relay)")
    relay_host: str = option("127.0.0.1", help="address the relay listens on")
    relay_url: str | None = option(None, help="URL peers reach the relay at (None: http://HOST:PORT)")
    relay_wait_s: float = 4.0  # a peer asking for a piece still arriving here waits this long
    # The fleet read credential (weight_sync.fleet_credential; $FLYWHEEL_STORE_TOKEN): the store server and
    # every relay want it, this agent's relay asks it of its peers. An s3:// store signs with AWS_* instead.
    store_token: str | None = option(
        None, env=fleet_credential.ENV, cli=False, repr=False, help="the fleet read credential"
    )
    # A peer slower than this is dropped within seconds and the store serves instead (weight_sync.agent.peer_rate).
    peer_bound: PeerBound = field(default_factory=PeerBound)

    def __post_init__(self):
        check_modes(self)
        if self.public_key is None:
            self.public_key = flywheel_home() / "weights" / "keys" / "signing.pub"
        if self.work_dir is None:
            self.work_dir = flywheel_home() / "weights" / "agents" / self.name
        if self.relay_port:
            self.relay_config()  # checks port, host and URL now, not at the first apply
            fleet_credential.checked(self.store_token, "a relay")  # never one that anyone could read from
            if self.relay_wait_s >= self.peer_bound.first_byte_s:  # an honest relay, still waiting, taken for slow
                raise ValueError("relay_wait_s must be below the peers' first-byte deadline (peer_bound.first_byte_s)")

    def relay_config(self) -> RelayConfig | None:
        if not self.relay_port:
            return None
        return RelayConfig(
            Path(self.work_dir) / "relay",
            self.relay_port,
            self.relay_host,
            self.relay_url,
            self.relay_wait_s,
            token=self.store_token,
        )
