"""Weight sync: the trainer's versions to the serving fleet.

- publish.py, codec.py, manifest.py, store.py: delta encoding, signed manifests, the version store
- fetch.py, agent.py, switch.py: the serving-side agent (fetch, verify, rebuild, hot-switch)
- canary.py: a version tried on part of the fleet, then promoted or rolled back
"""
