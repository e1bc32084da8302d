"""The two credentials of an SGLang replica, one per role (DESIGN, Trust boundaries).

SGLang checks them itself (`--api-key`, `--admin-api-key`): with both set, its inference endpoints
(/generate, /v1/*, /model_info, /server_info) take only the inference key, and its control endpoints
(/update_weights_from_disk, /update_weights_from_tensor, /flush_cache, /abort_request, /pause_generation)
only the admin key; /health* and /metrics stay open (probes, Prometheus).

    inference key   the gateways (and the trainer's numerics check): they generate, nothing else
    admin key       that replica's weight agent only (it also holds the inference key, to read the
                    replica's version): it switches weights

Keys travel in environment variables, never on a command line (`ps` shows every process's arguments).
A process without one calls the replica without it, which a replica started with keys refuses (401).
"""

from __future__ import annotations

import os
import secrets

INFERENCE_ENV = "FLYWHEEL_REPLICA_KEY"
ADMIN_ENV = "FLYWHEEL_REPLICA_ADMIN_KEY"


def new_key(role: str) -> str:
    return f"fw-replica-{role}-{secrets.token_urlsafe(24)}"


def inference_key() -> str | None:
    return os.environ.get(INFERENCE_ENV) or None


def admin_key() -> str | None:
    return os.environ.get(ADMIN_ENV) or None


def bearer(key: str | None) -> dict[str, str]:
    """The header that carries a key (none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def inference_headers() -> dict[str, str]:
    return bearer(inference_key())


def admin_headers() -> dict[str, str]:
    return bearer(admin_key())


def env(inference: str | None, admin: str | None = None) -> dict[str, str]:
    """A child's environment entries for the keys it holds; a role it does not hold is set empty, so
    that it never inherits a key from the parent's environment."""
    return {INFERENCE_ENV: inference or "", ADMIN_ENV: admin or ""}
