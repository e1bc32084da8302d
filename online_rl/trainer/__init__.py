"""The trainer daemon (`flywheel train`): its loop, the update (loss, passes, epochs), its ranks and their sharding,
crash-safe checkpoints, how it lives with failures, its metrics, and the hand-off of each version to weight_sync.

- `checkpoints`: The trainer's checkpoints and its ledger: exactly-once accounting across kill -9.
- `export`: The trainer's weights as a Hugging Face checkpoint for weight_sync, streamed tensor by tensor.
- `failures`: How the trainer daemon lives with failures: one sample, one rollout group, one HTTP call, one publish,
  one announce.
- `loop`: The trainer daemon (`flywheel train`): a short loop over clear parts.
- `loss`: The policy-gradient update: advantages, batches with router replay, and the loss.
- `metrics`: The trainer's Prometheus metrics (served on --metrics-port).
- `publisher`: The trainer's hand-off to weight_sync: the current weights as the next version in the store, then its
  announcement on the weights topic.
- `ranks`: The trainer's ranks (`flywheel train --nproc N`): rank 0 runs the loop and does all I/O; the others
  follow it, doing what rank 0 tells them in the order it tells them, so that every collective is entered by every
  rank in the same order.
- `sharding`: How the trainer's model is spread over its ranks: `dp` keeps a whole copy (and optimizer state) on
  every rank and sums gradients with one all-reduce (online_rl.trainer.update); `fsdp` shards parameters, gradients
  and optimizer state over the ranks with torch's FSDP2 (`fully_shard`, one unit per decoder block, then the root
  for the embedding, final norm and head), so a rank holds about 1/N of them and gathers one block at a time.
- `update`: The update over a list of samples (its policy-gradient passes, PPO's epochs, and the distillation's own
  step where configured), on one process or over several ranks (gloo on CPU, the same calls take NCCL on GPUs): rank
  0 hands every rank the whole batch, each rank takes its share of the sequences, gradients are summed across ranks
  (one all-reduce of a whole copy under `dp`; FSDP2's reduce-scatter into each rank's shard under `fsdp`,
  online_rl.trainer.sharding), and every rank steps.
"""
