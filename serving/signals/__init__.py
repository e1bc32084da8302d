"""What clients say about a completion besides /v1/feedback: Continue's development data, implicit verdicts read from
agent sessions, which session and which completion a turn continues, the first-feedback rule, and what an answer
shows of a model gaming its reward.

- `devdata`: Continue's development data, read: what each event kind says about a completion served here.
- `first_feedback`: Only the first feedback on a completion's choice counts.
- `hacking`: Reward-hacking detectors: what an answer or a tool result shows of a model gaming its reward rather than
  doing the task.
- `implicit`: Verdicts an agent session carries without the client ever calling /v1/feedback: what the client sends
  on the next turn says how the last one went.
- `served_index`: Which completion a client's own telemetry is about, when the client never saw our completion id.
- `session_ids`: What a session id becomes in the events: a client-named one is free text, scanned for secrets like
  the prompts (serving.event_log.secret_scrub), and one that holds a secret never reaches the spool or Kafka.
- `sessions`: Which agent session a chat request continues, and which completion produced the turn before it.
"""
