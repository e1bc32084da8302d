"""`flywheel demo`: the whole loop on one machine with a simulated population of IDE users and an agent user, and its
per-version report.

- `agent_session`: One agent session against the gateway, as a coding agent runs it: the model is asked to implement
  a function in a file and works through three tools (read_file, write_file, run_tests: the tool language of
  online_rl.tasks.agent_episodes) until it answers in text or runs out of turns.
- `gate`: The eval gate in the demo: `flywheel gate --follow` beside a trainer started with --gate, on the machine's
  spare capacity (one torch thread, niced below serving); its verdicts and costs per version read back from the
  store's signed gate records.
- `house_style`: A cheaper preference than the hidden tests, judged by code in-process (load tests, chaos drills):
  the house style.
- `population`: A simulated population of IDE users with a hidden preference.
- `report`: The demo's per-version summary: what users saw of each weight version, and what each switch cost.
- `run`: `flywheel demo`: the whole loop on one machine, ending by itself.
- `signal_quality`: How well each implicit signal (serving.signals.implicit) tells the truth, against a simulated
  population that knows it (flywheel.demo.agent_session.UserModel): the benchmark's and the demo's figures.
"""
