"""Locust users shaped like IDE clients and SRE scenarios (steady, hot switch, rollback, broker outage).
The simulated population of the closed-loop demo, whose hidden preference and agent sessions the users
here share, lives in the layer below (flywheel.demo.population, flywheel.demo.agent_session).

- `cli`: `flywheel loadtest SCENARIO`: locust scenarios for SREs (see loadtests/runner.py and docs/loadtests.md).
- `fleet_drill`: The fleet over test hosts under simulated IDE traffic, through HAProxy, with the faults a multi-
  host fleet must ride through (`python -m benchmarks.fleet`; a short run in the suite).
- `ide_prefix`: IDE traffic whose prompts share long prefixes: users editing files of thousands of tokens.
- `ide_users`: Locust users shaped like IDE clients, and the pass/fail rules every scenario shares.
- `kafka_check`: After a run: is every completion and feedback event the load test caused in Kafka?.
- `plot`: Latency and throughput over a load test, with the scenario's actions marked.
- `runner`: `flywheel loadtest SCENARIO`: run one locust scenario headless and judge it.
- `scenario`: A scenario's timeline inside a locust run: actions at fractions of the run time, done with the same
  `flywheel` commands an SRE types (in a subprocess, so the load generator's event loop never blocks).
- `versions`: Checkpoints to publish during load tests, made from the served model without a trainer run.
"""
