"""Each tenant's own namespace in the replicas' prefix caches: no prefix is reused across tenants.

A prefix cache shared by everyone is a side channel: a prompt whose prefix another tenant sent is served
faster and comes back with `cached_tokens` > 0, so a tenant can test guesses of another's file, token by
token. SGLang keys its radix cache by the request's `cache_salt` as well as its tokens (RadixKey's namespace,
for the tree, its storage tiers and its KV events; `extra_key` is the caller's classification, which SGLang
also appends LoRA ids to): the gateway sends every user request with a salt of its tenant, and the
cache-aware router names prefixes with the same value (serving.routing.prefix_index), so that neither the
engine nor the routing lets one tenant's prompts make another's faster. A tenant's own requests share one
salt, and so its prefixes, whichever gateway of the fleet serves them.

The salt is an HMAC of the tenant id under the fleet's id secret (serving.auth.load_or_create_secret,
shared by the gateways behind one load balancer), not the tenant id itself: tenant ids appear in
completion ids, a salt must not be something a caller who reaches a replica could compute.
"""

from __future__ import annotations

import hashlib
import hmac

_DOMAIN = b"flywheel prefix cache scope\x00"  # never equal to another use of the same secret (completion ids)


class CacheScopes:
    def __init__(self, secret: bytes | None):
        """secret None: isolation off, every request in one shared scope (--no-isolate-tenants: a fleet of
        one tenant, or a benchmark of what isolation costs)."""
        self._secret = secret

    @property
    def isolating(self) -> bool:
        return self._secret is not None

    def of(self, tenant: str | None) -> str | None:
        """The cache_salt of a tenant's requests; None for requests of no tenant (rollouts, trainer's own)."""
        if self._secret is None or tenant is None:
            return None
        return hmac.new(self._secret, _DOMAIN + tenant.encode(), hashlib.sha256).hexdigest()[:32]
