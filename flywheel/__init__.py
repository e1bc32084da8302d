"""Flywheel: the command line, the demo, the local fleet and the development Kafka broker (the top layer),
above every other package.

- `chaos/`: `flywheel chaos`: the whole loop under faults, and the audit afterwards that nothing was lost, trained
  twice or left running.
- `cli`: `flywheel`: one command line; each package adds its own subcommands through a `register` function.
- `demo/`: `flywheel demo`: the whole loop on one machine with a simulated population of IDE users and an agent
  user, and its per-version report.
- `hosts/`: Test hosts (`flywheel hosts`): network namespaces on one bridge, a fleet laid over them, and HAProxy in
  front of several gateways.
- `kafka/`: The development Kafka 4 broker (`flywheel kafka`): one KRaft node on loopback or a cluster over test
  hosts, its jars, and its security material.
- `local_fleet`: A whole fleet on this machine, for `flywheel demo` and `flywheel loadtest`: a Kafka broker, a
  weight store (signing keys, v0 = the model, its HTTP server), SGLang replicas on CPU, the gateway, and one weight
  agent per replica following the `weights` topic.
- `observe/`: What an SRE sees (`flywheel observe`): a real Prometheus scraping the fleet, the alert rules and their
  runbooks, and the Grafana dashboard.
- `s3proxy`: A real S3 protocol server for tests and benchmarks: S3Proxy (org.gaul:s3proxy) on the jclouds
  filesystem backend, on loopback and a free port, with an access key and secret so requests are really signed.
- `status/`: `flywheel status`, the SRE's one screen: gathered from the running fleet (gather, sources, kafka_lag)
  and drawn (panels, screen).
- `tenants_cli`: `flywheel tenants list|policy|forget|provenance`: tenants' privacy, for the operator.
"""
