"""What the trainer learns from: Kafka's streams read (reader) and joined into rewarded samples (join, samples),
distillation's samples, tenants' privacy and share of a batch, the provenance of each version, and simulated events
for tests and benchmarks.

- `distill_samples`: On-policy distillation's data: for a completion a user commented on, fresh completions of the
  same served context by the model as it is now (the student), each carrying the comment's hint for the teacher.
- `join`: Join the completions and feedback streams into rewarded samples.
- `provenance`: Which tenants' samples each published version was trained on.
- `reader`: The trainer's view of Kafka: completions, feedback, the weights topic and the tenants' policies, read
  from the offsets its checkpoint holds (not the group's), and committed to the group only after a checkpoint has
  them.
- `samples`: What the trainer learns from: a sample is one completion with its reward, from a user or a rollout.
- `simulate`: Completions and their events made with the trainer's own model, shaped as serving logs them: for
  tests, benchmarks and rehearsals of the trainer without a fleet.
- `tenant_share`: No tenant fills a training batch: its user samples take at most `max_tenant_share` of a batch's
  places (`batch_size`), so a tenant that floods the stream with judged completions steers each update no more than
  that share, and the other tenants' samples are not pushed out (or left to go stale) behind its flood.
- `tenants`: Tenants' privacy in the training loop: which events and samples the trainer may learn from.
"""
