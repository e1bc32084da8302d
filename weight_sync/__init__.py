"""Weight sync: delta encoding, signed manifests, the version store, the serving-side agent, rollback.

(Grows with the weight-sync issue; see shared/DESIGN.md, "Weights" and "Hot-switch".)
"""
