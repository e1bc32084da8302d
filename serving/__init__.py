"""The serving side of Flywheel: SGLang replicas, and (later) the gateway, routing and event producer."""
