"""Running model-written code against hidden tests: the judge the trainer and the demo call, the bubblewrap jail around
one candidate, and the runner that executes inside it; and a repository's test suite run in the same jail.

- `jail`: The isolation around one candidate: a bubblewrap (`bwrap`) command line, and the checks that it works.
- `judge`: Run model-written code against hidden tests, in a bubblewrap sandbox it cannot escape or game.
- `process`: Starting a runner in a fresh jail and exchanging with it: its settings, the job in, the capped answer
  out, the wall clock, the outer uid.
- `runner`: The program that runs inside the sandbox: one candidate against its test inputs.
- `suite`: Run a repository's tests in the sandbox (a copy of its files with one body replaced): outcomes per test
  and per repeat, for mining tasks from real code (online_rl.tasks.mining) and judging them.
- `suite_runner`: The program that runs inside the sandbox for a suite job: one test module, with unittest.
"""
