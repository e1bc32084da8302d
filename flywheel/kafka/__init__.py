"""The development Kafka 4 broker (`flywheel kafka`): one KRaft node on loopback or a cluster over test hosts, its
jars, and its security material.

- `broker`: A real Apache Kafka 4 broker (KRaft: broker and controller in one JVM): a single node on loopback, or
  one node of a cluster on a test host (flywheel.kafka.cluster: a static quorum of voters, topics replicated).
- `cli`: `flywheel kafka fetch|start|stop|status`: the local single-node broker.
- `cluster`: A Kafka 4 cluster over test hosts: one KRaft node (broker and controller) per host, a static quorum of
  voters, topics replicated three ways with min.insync.replicas=2, so one broker can die under load and nothing
  acknowledged is lost (producers ask for acks=all).
- `security`: A broker's security material and settings (infra.kafka_auth says who may do what): its CA, its
credentials, its listeners.
"""
