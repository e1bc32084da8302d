"""Locust users shaped like IDE clients, the simulated user population, and SRE scenarios.
(Grows with the load-test issue.)
"""
