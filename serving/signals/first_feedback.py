"""Only the first feedback on a completion's choice counts. IDE clients resend, and one tenant could
otherwise promote or roll back a canary with a hundred identical accepts. Bounded: the oldest pairs are
forgotten first (a completion id is only good for its TTL anyway)."""

from __future__ import annotations

from collections import OrderedDict


class FirstFeedback:
    def __init__(self, capacity: int = 500_000):
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def first(self, completion_id: str, choice: int) -> bool:
        """True the first time (completion_id, choice) is judged, False every time after."""
        key = (completion_id, choice)
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True
