"""broker-outage: Kafka goes down mid-run and comes back. Users must not notice (zero failed requests,
p99 within the allowed multiple); the gateway spools events on disk and replays them, which
`flywheel loadtest` checks afterwards: every completion and feedback event issued is in Kafka."""

from loadtests import ide_users, scenario
from loadtests.ide_users import AgentUser, AutocompleteUser, ChatUser  # noqa: F401  (the users locust runs)


def stop_broker(state):
    ide_users.mark("kafka stopped")
    scenario.shell(scenario.env("FLYWHEEL_BROKER_STOP_CMD"))


def start_broker(state):
    scenario.shell(scenario.env("FLYWHEEL_BROKER_START_CMD"), timeout=180)
    ide_users.mark("kafka started")


scenario.install([(0.3, stop_broker), (0.6, start_broker)])
