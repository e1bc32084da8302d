"""The eval gate: a version the trainer publishes is judged on a held-out suite against the version the fleet
serves before any user sees it; a regression blocks it (weight_sync.gate records the verdict and announces what
passes).

- `cli`: `flywheel gate N`: judge version N (published with the gate on: in the store, not announced) against the
  version the fleet serves, on the held-out suite; announce it if it passes, record the block if not.
- `run`: The eval gate: rebuild both versions from the store, run the suite on each, judge, record the verdict, and
  announce the version only if it passed; what the evaluation cost is in the record.
- `suite`: The held-out suite: one checkpoint's outcomes item by item (pass@1, agent-session success, valid tool
  calls, answer length, empty or refused answers).
- `verdict`: The judgement: each metric, candidate against the serving version, with a one-sided test and a margin;
  any regression blocks.
"""
