"""Coding tasks: the synthetic families judged by hidden tests, the agent episodes built from them, and how the agent
clients people run look to the model.

- `agent_clients`: How the agent clients people run look to the model, for the bootstrap corpus: their tools, their
  shell's answers and the context they send around a user's request.
- `agent_episodes`: Agent episodes for the bootstrap corpus: the tiny model learns a small tool language.
- `mining/`: Tasks mined from real code (issue #50): a function's body deleted from a repository with tests, judged
  by the tests that fail without it, verified in the sandbox; `flywheel tasks mine`.
- `family`: A task family: what every task of one kind shares (argument type, name and docstring templates, the
  reference body and the plausible wrong ones).
- `multiline`: Multi-line task families: bodies of three to six lines where each wrong body differs from the
  reference in one line, so a user's comment can name the line that is wrong.
- `corpus`: The bootstrap corpus: documents made from the train split's tasks (online_rl.tasks.synthetic), each
  ending in EOS, deterministic for a seed.
- `synthetic`: Synthetic coding tasks: small Python functions described by a docstring, judged by hidden tests.
"""
