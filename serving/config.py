"""The gateway's configuration, the one source of `flywheel serve`'s options (infra.config).
Light to import: the command line is built from it without loading the server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.config import nested, option
from serving.protocol.limits import Limits


@dataclass
class PoolConfig:
    health_interval_s: float = 2.0
    health_timeout_s: float = 5.0


@dataclass
class RoutingConfig:
    """How the gateway picks a replica for a user's request (serving.routing)."""

    policy: Literal["cache_aware", "least_outstanding"] = option(
        "cache_aware",
        flag="routing",
        help="cache_aware: where the prompt's prefix is cached unless that replica is busier by "
        "--balance-threshold; least_outstanding: the fewest requests in flight",
    )
    block_tokens: int = option(16, help="cache_aware: prompt tokens per block of the prefix index")
    min_match_tokens: int = option(
        64, help="cache_aware: a cached prefix shorter than this is not worth a less loaded replica"
    )
    balance_threshold: int = option(
        4, help="cache_aware: requests in flight over the least loaded replica's before the cache is ignored"
    )
    isolate_tenants: bool = option(
        True,
        help="prefix caches per tenant, in the replicas (SGLang's cache_salt) and the cache-aware index: no "
        "tenant's prompt is served faster, or with cached_tokens, because another tenant sent its prefix",
    )
    # The index follows each replica's KV capacity (its sglang:max_total_num_tokens); this until it is read.
    default_capacity_tokens: int = 65536


@dataclass
class TenantLimitsConfig:
    """Requests per API key and per tenant (every key of one name): a sustained rate with a burst (a token
    bucket) and a count in flight; over either, a 429 with Retry-After (serving.tenants.limits). The defaults
    are far above one IDE user (a few requests a second) and the load tests, and bound a flood; a keys file's
    `"limits": {name: {field: value}}` sets any of them for one tenant. 0: no limit of that kind."""

    key_rate_per_s: float = option(500.0, help="requests per second one API key may make, sustained")
    key_burst: int = option(1000, help="requests one API key may make at once above its rate (the bucket's size)")
    key_concurrency: int = option(128, help="requests one API key may have in flight (streams included)")
    tenant_rate_per_s: float = option(2000.0, help="requests per second all keys of one tenant may make together")
    tenant_burst: int = option(4000, help="the same tenant's burst")
    tenant_concurrency: int = option(512, help="requests all keys of one tenant may have in flight")


def check_tenant_limits(name: str, fields) -> dict:
    """A tenant's limits from the keys file, checked: a typo must not mean "no limit"."""
    known = TenantLimitsConfig.__dataclass_fields__
    if not isinstance(fields, dict) or set(fields) - set(known):
        raise ValueError(f"tenant {name!r}: limits are an object of {', '.join(known)}")
    for k, v in fields.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise ValueError(f"tenant {name!r}: limit {k} must be a number >= 0 (0: no limit), not {v!r}")
    return dict(fields)


@dataclass
class GatewayConfig:
    replicas: list[str] = field(default_factory=list)
    model_dir: Path | None = None  # tokenizer.json + config.json of the served model
    model_name: str = option("flywheel-coder", help="the model's name in the API (/v1/models)")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8000, help="port to listen on")
    state_dir: Path = Path("gateway-state")  # event spool, id secret
    keys_file: Path | None = None
    api_keys: str | None = option(None, env="FLYWHEEL_API_KEYS", cli=False, help="'name:key,...' beside the keys file")
    admin_token: str | None = option(None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the admin endpoints' token")
    kafka_bootstrap: str | None = option(
        None,
        flag="kafka",
        env="FLYWHEEL_KAFKA_BOOTSTRAP",
        help="Kafka bootstrap servers (none: events stay in the spool)",
    )
    log_events: bool = option(True, flag="events", help="log completion and feedback events (--no-events: benchmarks)")
    scrub_secrets: bool = option(
        True,
        env="FLYWHEEL_SCRUB_SECRETS",
        help="withhold the content of events whose prompt, output or comment holds a secret "
        "(serving.event_log.secret_scrub)",
    )
    abandon_after_s: float = option(
        600.0, help="an agent session whose tool results have not come back for this long counts as abandoned"
    )
    response_retention_days: float = option(
        30.0, help="days a stored Responses API answer is kept (a tenant's retention_days, if shorter, wins)"
    )
    limits: Limits = nested(Limits)
    tenant_limits: TenantLimitsConfig = nested(TenantLimitsConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    routing: RoutingConfig = nested(RoutingConfig)
    request_timeout_s: float = option(
        300.0,
        flag="request-timeout",
        help="seconds a replica has for one request before the gateway gives up on it and fails over",
    )
    max_attempts: int = option(3, help="replicas tried for one request that fails before its first byte")
    max_spool_bytes: int = option(1 << 30, help="bound of the on-disk event spool while Kafka is away")
    # A response waits (at most this long) until its completion or feedback event is in the spool, so a gateway
    # that crashes never loses an event its client was answered for. Past it (disk full, failing) the
    # response goes out anyway, counted: serving does not stop for the spool.
    durable_wait_s: float = option(
        2.0, flag="durable-wait", help="seconds a response waits for its event to be spooled before it goes out anyway"
    )
    # The spool's durability (serving.event_log.sync_window): a response waits for its event's write; the writer
    # thread syncs it within this window, and the request path itself when the writer is late, so no response is
    # released while an event older than the window is unsynced. A killed gateway loses nothing, a machine crash what
    # was not synced: the window, more only for as long as the gateway process got no CPU (counted: /health).
    # 0: strict, a response waits for the fdatasync too.
    spool_sync_window_s: float = option(
        0.01,
        flag="spool-sync-window",
        help="seconds a spooled event may wait for its fdatasync (what a machine crash may lose; 0: sync before "
        "answering)",
    )
