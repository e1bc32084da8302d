"""Online RL: the trainer daemon and what it learns from and with.

- `cli`: `flywheel model bootstrap`: build (or fetch from the cache) the base checkpoint.
- `config`: The trainer's configuration, one dataclass per part, as the one source of its options (infra.config):
  each option's default, help and environment variable is written here once, and `flywheel train`'s flags are
  generated from it.
- `data/`: What the trainer learns from: Kafka's streams read (reader) and joined into rewarded samples (join,
  samples), distillation's samples, tenants' privacy and share of a batch, the provenance of each version, and
  simulated events for tests and benchmarks.
- `gate/`: The eval gate (`flywheel gate N`): a published version judged on a held-out suite against the version
  the fleet serves before any user sees it; a regression blocks it.
- `gpu_check/`: The prepared GPU check (`python -m online_rl.gpu_check.check`): one run on a lent GPU, in sections
  each under its own time budget.
- `model/`: The model: a compact Qwen3-MoE (transformer) with its Hugging Face config (config), the tokenizer view
  the trainer needs, and the base checkpoint built here (bootstrap: its presets, the BPE tokenizer, mid-training and
  the evaluation) or randomly initialised at larger sizes.
- `numerics`: `flywheel numerics`: how far the trainer's logprobs of served tokens are from the ones SGLang served.
- `offpeak`: The off-peak scheduler: borrow serving replicas for rollouts while user load is low, give them back
  before users notice.
- `plots`: Figures of a trainer's run, drawn from what it writes (`history.json`), never by the daemon itself.
- `rollouts`: Sandbox rollouts: held-out tasks sampled on serving replicas (the gateway's admin path), judged by
  their hidden tests in the sandbox; each task's samples form one group (group-relative advantages).
- `sandbox/`: Running model-written code against hidden tests: the judge the trainer and the demo call, the
  bubblewrap jail around one candidate, and the runner that executes inside it.
- `tasks/`: Coding tasks: the synthetic families judged by hidden tests, the agent episodes built from them, and how
  the agent clients people run look to the model.
- `trainer/`: The trainer daemon (`flywheel train`): its loop, the update (loss, passes, epochs), its ranks and
  their sharding, crash-safe checkpoints, how it lives with failures, its metrics, and the hand-off of each version
  to weight_sync.
"""
