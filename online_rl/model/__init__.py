"""The model: a compact Qwen3-MoE (transformer) with its Hugging Face config (config), the tokenizer view the trainer
needs, and the base checkpoint built here (bootstrap) or randomly initialised at larger sizes.

- `bootstrap`: Make the base model here: a byte-level BPE tokenizer and a tiny Qwen3-MoE mid-trained on the task
  corpus.
- `config`: The model's dimensions, and their Hugging Face config.json both ways (online_rl.model.transformer builds
  the model).
- `random_checkpoint`: Checkpoints of our Qwen3-MoE shape at sizes the bootstrap presets never reach, randomly
  initialised.
- `tokenizer`: What the trainer needs of the base model's tokenizer: a completion's length in characters (partial
  accepts), a comment's token ids (a hint), where a hint line fits in a prompt, and the ids a completion ends at.
- `transformer`: The trainer's model: a compact Qwen3-MoE (also the dense Qwen3 and Llama), loading and saving the
  Hugging Face layout.
"""
