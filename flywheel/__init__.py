"""Flywheel: the command line and the local infrastructure every package shares (cache, broker)."""
