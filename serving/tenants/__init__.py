"""Tenants on the gateway: their limits, their privacy policies in effect, and their own namespaces in the replicas'
prefix caches.

- `cache_scope`: Each tenant's own namespace in the replicas' prefix caches: no prefix is reused across tenants.
- `limits`: Per-tenant limits on the public API: no API key, and no tenant (every key of one name), can take the
  gateway from the others by the number of its requests.
- `policy`: Tenants' policies put into effect: the keys file is the source (serving.auth), this gateway's spool and
  the tenants topic follow it.
"""
