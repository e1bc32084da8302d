"""Tasks mined from real code: a function's body (or a whole feature: its definition and the statements that call
it) deleted from a repository with tests, kept when the tests that pass with it fail without it, every time, in the
sandbox (issue #50).

- `candidates`: Functions and methods worth deleting, found with ast, and the source with each body deleted.
- `sources`: Where mined code comes from: a local repository, a PyPI source distribution (pinned), or the standard
  library with Debian's test suite; each with its provenance.
- `features`: Whole features worth deleting: a function's definition together with the statements that call it (and
  the imports of it), found with ast; what cannot be removed as a statement is rejected with its reason.
- `verify`: Mine a source: each candidate's tests run with and without its body in the sandbox, kept or rejected
  with a reason (flaky, slow, passes without the code, ...).
- `verify_feature`: Mine a source in feature mode (`--mode feature`): the same checks with the feature's changed
  files, plus two half-restorations that must fail (an empty body; the definition without its calls).
- `store`: Mined tasks as JSON lines, each with its provenance; the hidden tests stay out of what the model sees.
- `judge`: Judge completions of mined tasks: the task's hidden tests run on the file(s) with the completion in place.
- `mixture`: Mined tasks as rollout environments, in a configured mixture with the synthetic families (the off-peak
  rollouts draw body tasks from it: RolloutConfig.mined_tasks and mined_share; the demo's agent sessions both
  kinds: PopulationConfig.mined_share).
- `cli`: `flywheel tasks mine SOURCE [--mode body|feature]`.
"""
