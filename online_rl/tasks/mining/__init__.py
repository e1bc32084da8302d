"""Tasks mined from real code: a function's body deleted from a repository with tests, kept when the tests that pass
with it fail without it, every time, in the sandbox (issue #50).

- `candidates`: Functions and methods worth deleting, found with ast, and the source with each body deleted.
- `sources`: Where mined code comes from: a local repository, a PyPI source distribution (pinned), or the standard
  library with Debian's test suite; each with its provenance.
- `verify`: Mine a source: each candidate's tests run with and without its body in the sandbox, kept or rejected
  with a reason (flaky, slow, passes without the code, ...).
- `store`: Mined tasks as JSON lines, each with its provenance; the hidden tests stay out of what the model sees.
- `judge`: Judge completions of mined tasks: the task's hidden tests run on the file with the completion in place.
- `mixture`: Mined tasks as rollout environments, in a configured mixture with the synthetic families (the off-peak
  rollouts draw from it: RolloutConfig.mined_tasks and mined_share).
- `cli`: `flywheel tasks mine SOURCE`.
"""
