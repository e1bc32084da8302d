"""Canary trials: a new version reaches a slice of the fleet and of the users first, and is promoted or rolled back on
what users did (controller, judge), with no tenant's votes counting for more than its share (votes).

- `controller`: Canary trials: a new version reaches a slice of the fleet and of the users first, and is promoted or
  rolled back on measured acceptance, latency and errors, without a person (`flywheel weights canary`).
- `judge`: The decision of a canary trial on its two arms' figures: promote, roll back, or wait for more
  (acceptance, latency, errors and malformed tool calls, each with a one-sided confidence bound).
- `votes`: How many of an arm's acceptance votes count in a canary trial (weight_sync.canary.judge.judge): no
  tenant's votes count for more than a share of the arm's, so no tenant decides a trial alone.
"""
