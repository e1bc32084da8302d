"""Weight sync: the trainer's versions to the serving fleet.

- `agent/`: The weight agent, one per replica (`flywheel weights agent`): its loop over the weights topic, fetching
  a version's pieces (from the store, S3 or a peer's relay), rebuilding it, and switching the replica (whole reload
  or in place) while the gateways drain it.
- `canary/`: Canary trials: a new version reaches a slice of the fleet and of the users first, and is promoted or
  rolled back on what users did (controller, judge), with no tenant's votes counting for more than its share
  (votes).
- `checkpoint`: Tensor-at-a-time access to safetensors checkpoints, as raw bit patterns (no framework, bounded
  memory).
- `cli`: `flywheel weights ...`: keys, publish, list, rollback, pin/unpin, the canary and the overrides of its trials
  and of the eval gate, the store server, and the agent.
- `codec`: Lossless per-tensor delta coding of weights: XOR with the base, then byte planes or a sparse form, then
  zstd.
- `fleet_credential`: The fleet read credential: what the weight store's server and every agent's relay ask of each
  caller.
- `gate`: The eval gate's side in weight_sync: a version held back from the weights topic until the gate
  (online_rl.gate) has judged it; its signed verdict, the announcement of what passes, and an SRE's override.
- `manifest`: The weights contract: a version's manifest, its ed25519 signature, and the checks a server applies.
- `publish`: Publish a checkpoint as the next version: delta against the previous one (or a full snapshot every K),
  signed, atomically visible in the store, announced on the Kafka `weights` topic.
- `store/`: The version store: the directory of published versions and its HTTP face (server), its ledgers, the
  store on S3, its metrics, and the peer relay's tracker and redirects.
- `topic_floor`: The highest sequence number on the weights topic signed by our key: the floor of the next one when
  the store's own memory of it is gone (its counter lost or damaged; a store rebuilt on a new host beside a topic
  that remembers).
"""
