"""How many of an arm's acceptance votes count in a canary trial (weight_sync.canary.judge.judge): no tenant's
votes count for more than a share of the arm's, so no tenant decides a trial alone.
"""

from __future__ import annotations


def capped_votes(votes: list, share: float) -> tuple[float, float]:
    """(accepts, rejects) that voters' [accepts, rejects] count for when none may count for more than `share` of
    the votes counted: each voter's scaled down to at most a level L, the highest L with L <= share x (the votes
    counted at L). share x counted(L) - L is concave and piecewise linear in L, 0 at 0: the highest L is where it
    crosses 0, found stretch by stretch between the voters' totals. One voter alone counts for nothing (share < 1);
    n voting alike count fully once n >= 1 / share."""
    totals = [a + r for a, r in votes]
    if share >= 1 or not totals:
        return float(sum(a for a, _ in votes)), float(sum(r for _, r in votes))
    level = float(max(totals))
    below = 0.0  # the votes of the voters under the level tried
    for k, t in enumerate(sorted(totals)):  # the counted votes at level L: below + (voters from the k-th) x L
        above = len(totals) - k
        if share * (below + above * t) < t * (1 - 1e-12):  # L = t is too high: the level lies before t
            level = share * below / (1 - share * above)  # where share x counted(L) = L on this stretch
            break
        below += t
    scale = [min(1.0, level / t) if t else 0.0 for t in totals]
    return sum(a * k for (a, _), k in zip(votes, scale)), sum(r * k for (_, r), k in zip(votes, scale))


def capped(arm: dict, share: float) -> dict:
    """An arm's figures with its acceptance votes as capped_votes counts them (a gateway that reports no
    tenant_votes: as they are)."""
    votes = arm.get("tenant_votes")
    if votes is None:
        return arm
    accepts, rejects = capped_votes(votes, share)
    counted = accepts + rejects
    return {
        **arm,
        "accepts": accepts,
        "rejects": rejects,
        "feedback": round(counted, 3),
        "feedback_cast": arm.get("feedback"),
        "tenants_voting": len(votes),
        "acceptance": round(accepts / counted, 4) if counted else None,
    }
