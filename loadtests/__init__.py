"""Locust users shaped like IDE clients and SRE scenarios (steady, hot switch, rollback, broker outage).
The simulated population of the closed-loop demo, whose hidden preference and agent sessions the users
here share, lives in the layer below (flywheel.demo.population, flywheel.demo.agent_session).
"""
