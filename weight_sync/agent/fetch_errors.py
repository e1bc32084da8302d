"""What fetching a version's pieces can fail with, whichever client fetches them (weight_sync.agent.fetch over
HTTP, weight_sync.agent.s3_fetch from a bucket): the agent's loop tells a missing version from a transient failure
by these."""

from __future__ import annotations


class FetchError(Exception):
    """A piece could not be downloaded intact (after retries)."""


class NotInStore(FetchError):
    """The store has no such piece (HTTP 404, a missing object); any other failure (a 5xx) is transient."""


class PackUnsupported(FetchError):
    """The store serves no /versions/N/changed (a store server older than it): fetch chunk by chunk."""
