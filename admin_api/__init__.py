"""The gateway's admin API, one home for both ends: its routes, the capability each needs and the tokens that carry it,
and the one client every caller uses (the trainer, the weight agents, the canary, flywheel status and tenants).

- `routes`: Every route (method, path template, capability): the gateway registers its handlers from them
  (serving.api.admin, serving.api.tenants) and its middleware asks them what a request needs.
- `types`: The request and answer bodies that cross (TypedDicts): drain, rollouts, the canary trial, tenants'
  policies; the replica, load, weights, canary and tenant views.
- `client`: One call to a gateway's admin API (bearer token, JSON in and out), for every client of it: the off-peak
  scheduler, the canary controller, the fleet CLI, the local fleet and the load-test scenarios.
- `tokens`: The admin API's tokens, one per capability (DESIGN, Trust boundaries): a process holds only the part it
  needs, so a leaked weight agent's token cannot change tenants' privacy, nor a dashboard's move replicas.
"""
