"""Serving: the gateway in front of the SGLang replicas, and the replicas themselves.

- gateway.py: wires the parts; api/ holds the HTTP routes (OpenAI API, feedback, admin) as sub-apps
- dispatcher.py: one choice on the fleet (pick, lease, retry before the first byte, log the event)
- router.py: the replica pool (states, health); routing/: which replica a request goes to (cache-aware,
  least-outstanding: one policy per file)
- schema.py, openai_api.py, tool_calls.py, sessions.py, prompts.py: requests in, responses out
- event_log.py, event_spool_writer.py, event_shipper.py, event_sink.py: events to disk, then to Kafka
- engine.py, auth.py, metrics.py, config.py: a replica's /generate, keys and ids, /metrics, the options
- replica.py, cpu_compat/: SGLang processes (and its CPU layer)
"""
