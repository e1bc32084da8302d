"""rollback: a good version, then a bad one, then `flywheel weights rollback` to the good one, all under
load; the fleet must end on the good version with zero failed requests. Requests the bad version served
are left out of the p99 comparison: a broken model rambles to max_tokens, which is its fault, not the
switch's."""

from loadtests import ide_users, scenario
from loadtests.ide_users import AgentUser, AutocompleteUser, ChatUser  # noqa: F401  (the users locust runs)


def publish_good(state):
    state["good"] = scenario.publish(scenario.versions()[0])
    scenario.wait_fleet_on(state["good"])


def publish_bad(state):
    state["bad"] = scenario.publish(scenario.env("FLYWHEEL_LOADTEST_BAD_VERSION"))
    ide_users.bad_versions.add(int(state["bad"]))
    scenario.wait_fleet_on(state["bad"])


def roll_back(state):
    scenario.rollback(state["good"])
    scenario.wait_fleet_on(state["good"])


scenario.install([(0.25, publish_good), (0.45, publish_bad), (0.65, roll_back)])
