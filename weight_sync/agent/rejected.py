"""A version the agent will not serve, and why (the reason is a label of its metrics and its alert)."""

from __future__ import annotations

# What the store or the replica says about the version itself: trying again gives the same answer.
PERMANENT = ("bad_manifest", "digest_mismatch", "corrupt_chunk", "chain_too_long", "unknown_version")


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
