"""Online RL: the trainer daemon and what it learns from and with.

- trainer.py: the loop (ingest, rollout, update, save, publish) over its parts: stream_reader.py (Kafka in),
  stream.py (the Joiner: completion + feedback -> rewarded sample), checkpoints.py (exactly-once state),
  publisher.py (the hand-off to weight_sync), trainer_metrics.py (/metrics); plots.py draws its history;
  tenants.py (tenants' privacy: withheld, denied, forgotten, aged-out data is never trained on) and
  provenance.py (which tenants' samples each published version was trained on)
- rollouts.py, sandbox*.py, tasks.py: offline tasks run by the model, judged in the sandbox
- offpeak.py: borrows serving replicas for rollouts while user load is low
- loss.py, update.py, model.py: the policy-gradient step on the tiny Qwen3-MoE
- config.py: every part's configuration (the `flywheel train` flags)
- bootstrap.py: the base model, made here from a seed
- gpu_check.py: the prepared check for a lent GPU (FSDP2 step, Triton kernels, the delta codec's GPU path,
  the batch-invariant forward), its parts in gpu_check_*.py
"""
