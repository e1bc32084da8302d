"""What crosses processes as bytes on Kafka or in a process's environment, one module per contract, importing nothing
of the repository: the event schema (serving writes it, online_rl reads it), its strict decoding, the signed control
records of the weights topic, the tool-call text format (the bootstrap corpus writes it, the gateway reads it) and a
replica's two credentials.

- `control`: Control records on the `weights` topic: what the fleet serves (version, canary, promote, rollback,
  activate, pin, unpin).
- `event_checks`: How contracts.events decodes a record it cannot trust: the types and ranges of every field, the
  packed arrays, and BadRecord with the reason a record is refused.
- `events`: The event contract between serving and online_rl: topics, schemas and their wire format.
- `replica_keys`: The two credentials of an SGLang replica, one per role (DESIGN, Trust boundaries).
- `tool_format`: The text contract of agent mode: how a chat with tools reads to the model and how its calls are
  read back.
"""
