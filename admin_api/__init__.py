"""The gateway's admin API, one home for both ends: its routes, the capability each needs and the tokens that carry it,
the bodies that cross, and the one client every caller uses (the trainer, the weight agents, the canary, flywheel
status and tenants). No other module spells an admin path (tests/unit/admin_api/test_admin_api_home.py).

- `routes`: Every route (method, path template, capability): the gateway registers its handlers from them
  (serving.api.admin, serving.api.tenants) and its middleware asks them what a request needs; clients build URLs
  with them.
- `types`: The request and answer bodies that cross (TypedDicts): drain, rollouts, the canary trial, tenants'
  policies; the replica, load, weights, canary and tenant views.
- `client`: The one client, a method per route: `AdminClient` (urllib, blocking: the off-peak scheduler, rollouts,
  the canary controller, the fleet, status, observe and tenants commands, the local fleet, load tests, benchmarks)
  and `AsyncAdminClient` (aiohttp: the weight agent's drains during a switch).
- `tokens`: The admin API's tokens, one per capability (DESIGN, Trust boundaries): a process holds only the part it
  needs, so a leaked weight agent's token cannot change tenants' privacy, nor a dashboard's move replicas.
"""
