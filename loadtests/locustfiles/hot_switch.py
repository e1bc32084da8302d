"""hot-switch: three versions published under load; each must reach every replica while users keep
their latency (zero failed requests, p99 after the first publish within the allowed multiple of before)."""

from loadtests import scenario
from loadtests.ide_users import AgentUser, AutocompleteUser, ChatUser  # noqa: F401  (the users locust runs)


def _publish(i):
    def publish_version(state):
        v = scenario.publish(scenario.versions()[i])
        scenario.wait_fleet_on(v)

    return publish_version


scenario.install([(0.25, _publish(0)), (0.45, _publish(1)), (0.65, _publish(2))])
