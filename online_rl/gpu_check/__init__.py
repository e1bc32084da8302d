"""The prepared GPU check (`python -m online_rl.gpu_check.check`): one run on a lent GPU, in sections each under its
own time budget.

- `batch_invariant`: Section 4 of the prepared GPU check: the batch-invariant forward against the default one.
- `check`: The prepared GPU check: one run on a lent GPU (an H200: about 2-3 minutes, at most ~6 by the budgets),
  one JSON report.
- `codec`: Section 3 of the prepared GPU check: the delta codec's GPU path.
- `fsdp`: Section 1 of the prepared GPU check: an FSDP2 training step of the trainer's model on one device.
- `sections`: The section runner of the prepared GPU check (online_rl.gpu_check.check): each section runs under its
  own time budget and records its result or its error, so one failure or overrun does not lose the others.
"""
