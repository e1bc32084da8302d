"""The weight agent, one per replica (`flywheel weights agent`): its loop over the weights topic, fetching a version's
pieces (from the store, S3 or a peer's relay), rebuilding it, and switching the replica (whole reload or in place)
while the gateways drain it.

- `config`: The agent's configuration, the one source of `flywheel weights agent`'s options (infra.config).
- `fetch`: Download a version's pieces from a store server: parallel, resumable, checked against their digests, each
  request with the fleet read credential (weight_sync.fleet_credential).
- `fetch_errors`: What fetching a version's pieces can fail with, whichever client fetches them (fetch over HTTP,
  s3_fetch from a bucket).
- `gateway_drains`: The drains a switch holds on the gateways that route to its replica (weight_sync.agent.switch):
  asked of each gateway in one order, renewed while the replica loads (a lease: an agent that dies mid-switch never
  leaves its replica draining), ended after; and the admin HTTP call they and the switch make.
- `inplace`: In-place apply: a delta handed to the replica as only what changed, then persisted locally.
- `inplace_switch`: The agent's in-place switch: when a version can go to the replica as only what changed over the
  version it serves, the switch that hands it over, and the warm-up of that path.
- `local`: The versions an agent keeps on disk (rebuilt from base and delta, verified, pruned) and its state file,
  apart from the loop that decides which to serve.
- `loop`: The serving-side agent, one per replica: follow the `weights` topic, decide, switch, report.
- `metrics`: The agent's Prometheus metrics (flywheel_agent_*), every labelled series exported from the start at 0.
- `peer_rate`: How slow a peer may be: a floor under every transfer from another agent's relay.
- `relay`: An agent's relay: other agents fetch from it the pieces of a version this agent already verified.
- `s3_fetch`: The agent's client of a weight store on S3: the StoreClient interface (weight_sync/agent/fetch.py)
  over obstore.
- `switch`: Hot-switch one SGLang replica to a checkpoint directory, without failing or cutting short a request.
- `rejected`: A version the agent will not serve, and why (the reason is a label of its metrics and its alert).
- `stores`: The client for a store URL: a store server's over HTTP (weight_sync.agent.fetch) or an S3 bucket's
  (weight_sync.agent.s3_fetch), one interface.
"""
