"""Serving: the gateway in front of the SGLang replicas, and the replicas themselves.

- `api/`: The gateway's HTTP surface as aiohttp sub-applications, each given the parts of the gateway's state it
  uses (serving.gateway composes them; the APIs that run turns share turn.TurnParts).
- `auth`: API keys, the admin token, and completion ids that prove who they were issued to.
- `canary_split`: The gateway's side of a canary trial: which users go to the canary replicas, and what each arm
  saw.
- `cli`: `flywheel replica start|stop|status`: SGLang replicas on this machine.
- `config`: The gateway's configuration, the one source of `flywheel serve`'s options (infra.config).
- `event_log/`: The event log off the request path: the gateway builds each completion's event (completion) and
  submits every event to an on-disk spool (sink, spool, spool_writer), a child process ships the spool to Kafka
  (shipper) after scanning its text for secrets (scan, secret_scrub), and a tenant's records can be forgotten before
  they leave (forget).
- `gateway`: The Flywheel gateway: an OpenAI-compatible API in front of SGLang replicas (aiohttp).
- `gateway_process`: Run the gateway as its own process (`flywheel serve`), as the demo and the tests do; stop it by
  PID.
- `metrics`: Prometheus metrics of one gateway (its own registry, so several gateways can live in one process).
- `monitors`: Reward-hacking monitors per weight version: tool-call outcomes, repeated calls, and what each detector of
  serving.signals.hacking flagged, with the answers' length.
- `protocol/`: The public APIs' request validation and response shapes: OpenAI's completions and chat, the Responses
  and Messages APIs, their function tools and client schemas, and the prompt a replica runs.
- `replica/`: SGLang replicas: launched (process, launch, with the CPU layer cpu_compat on a CPU-only machine) and
  spoken to (engine, the client of one replica's native API).
- `response_store`: What `store: true` keeps of a Responses API answer: the response object, the conversation it
  ended (what `previous_response_id` continues from) and its input items, per tenant, in SQLite beside the gateway's
  state.
- `routing/`: Which replica serves a user's request: routing policies behind one small interface.
- `signals/`: What clients say about a completion besides /v1/feedback: Continue's development data, implicit
  verdicts read from agent sessions, which session and which completion a turn continues, the first-feedback
  rule, and the reward-hacking detectors.
- `tenants/`: Tenants on the gateway: their limits, their privacy policies in effect, and their own namespaces in
  the replicas' prefix caches.
- `version_stats`: User completions, their latency and their first feedback, by the weight version that served them.
"""
