"""Flywheel: the command line, the demo, the local fleet and the development Kafka broker (the top layer),
above every other package."""
