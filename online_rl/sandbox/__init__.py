"""Running model-written code against hidden tests: the judge the trainer and the demo call, the bubblewrap jail around
one candidate, and the runner that executes inside it.

- `jail`: The isolation around one candidate: a bubblewrap (`bwrap`) command line, and the checks that it works.
- `judge`: Run model-written code against hidden tests, in a bubblewrap sandbox it cannot escape or game.
- `runner`: The program that runs inside the sandbox: one candidate against its test inputs.
"""
