"""The weight agent, one per replica (`flywheel weights agent`): its loop over the weights topic, fetching a version's
pieces (from the store, S3 or a peer's relay), rebuilding it, and switching the replica (whole reload or in place)
while the gateways drain it.

- `fetch`: Download a version's pieces from a store server: parallel, resumable, checked against their digests, each
  request with the fleet read credential (weight_sync.fleet_credential).
- `fetch_errors`: What fetching a version's pieces can fail with, whichever client fetches them (fetch over HTTP,
  s3_fetch from a bucket).
- `gateway_drains`: The drains a switch holds on the gateways that route to its replica (weight_sync.agent.switch):
  asked of each gateway in one order, renewed while the replica loads (a lease: an agent that dies mid-switch never
  leaves its replica draining), ended after; and the admin HTTP call they and the switch make.
- `inplace`: In-place apply: a delta handed to the replica as only what changed, then persisted locally.
- `loop`: The serving-side agent, one per replica: follow the `weights` topic, rebuild each version, hot-switch.
- `peer_rate`: How slow a peer may be: a floor under every transfer from another agent's relay.
- `relay`: An agent's relay: other agents fetch from it the pieces of a version this agent already verified.
- `s3_fetch`: The agent's client of a weight store on S3: the StoreClient interface (weight_sync/agent/fetch.py)
  over obstore.
- `switch`: Hot-switch one SGLang replica to a checkpoint directory, without failing or cutting short a request.
"""
