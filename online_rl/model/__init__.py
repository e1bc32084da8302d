"""The model: a compact Qwen3-MoE (transformer) with its Hugging Face config (config), the tokenizer view the trainer
needs, and the base checkpoint built here (bootstrap: its presets, the BPE tokenizer, mid-training and the
evaluation) or randomly initialised at larger sizes.

- `bootstrap`: Make the base model here: a byte-level BPE tokenizer and a tiny Qwen3-MoE mid-trained on the task
  corpus.
- `bpe`: The base model's tokenizer: byte-level BPE trained on the corpus (`tokenizers`), with the FIM and tool-call
  markers as tokens of their own, saved in Hugging Face layout.
- `config`: The model's dimensions, and their Hugging Face config.json both ways (online_rl.model.transformer builds
  the model).
- `evaluate`: The base model's report card: held-out pass rates (greedy and sampled, hinted), and the agent turns'
  valid tool calls, judged in the sandbox.
- `loss_mask`: What mid-training does not learn in a document: a client's system prose and the newline after a call
  inside a turn's history.
- `midtrain`: Mid-training the base model on the corpus: documents packed into fixed-length rows (the long-context
  presets also train on whole long documents), then AdamW steps with progress.
- `presets`: The base model's presets: what the bootstrap builds (corpus, model, training, evaluation), one
  dataclass per part, and the named presets (test, demo, agent, ...) that the tests, the demo and the benchmarks
  build.
- `random_checkpoint`: Checkpoints of our Qwen3-MoE shape at sizes the bootstrap presets never reach, randomly
  initialised.
- `tokenizer`: What the trainer needs of the base model's tokenizer: a completion's length in characters (partial
  accepts), a comment's token ids (a hint), where a hint line fits in a prompt, and the ids a completion ends at.
- `transformer`: The trainer's model: a compact Qwen3-MoE (also the dense Qwen3 and Llama), loading and saving the
  Hugging Face layout.
"""
