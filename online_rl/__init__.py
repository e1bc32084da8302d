"""The trainer side of Flywheel: the model, its bootstrap, tasks and sandbox, and (later) the RL daemon."""
