"""The local infrastructure every process shares, importing only the contracts: where things live, starting and
stopping processes, files that survive a crash, configuration dataclasses as the one source of options, progress
bars, jars from Maven Central, and Kafka administration, logins and dead letters (the records a consumer refuses).

- `config`: Configuration dataclasses as the one source of options.
- `dead_letter`: Records a consumer refuses: counted, copied to the dead-letter topic, skipped.
- `files`: Files that must survive a crash whole: written beside, fsynced, renamed into place, the directory
  fsynced.
- `group_guard`: Guard of one server's process group: `python -I -S group_guard.py PGID` (started by
  infra.procs.spawn).
- `kafka_admin`: Kafka administration every package shares, whichever broker it talks to (the development one that
  flywheel.kafka.broker launches, or a cluster): creating the topics, reading a topic through to its end (audits,
  checks), and quieting kafka-python's logger around calls whose failures are expected.
- `kafka_auth`: Who may do what on the broker (DESIGN, Trust boundaries): one Kafka principal per role, each with a
  SCRAM password, and the ACLs that say what each may read and write.
- `maven`: Jars from Maven Central, resolved once with `mvn` into a cache directory (the Kafka broker, S3Proxy).
- `paths`: Where Flywheel keeps what outlives a checkout: the virtualenv, Kafka jars, built models.
- `procs`: Process and port helpers for the servers Flywheel starts on loopback (broker, replicas, gateway).
- `progress`: Progress bars for long operations: live on a terminal, a line every few seconds in a log file.
"""
