"""The off-peak scheduler's policy on load snapshots (no servers): hysteresis, hold, limits, no flapping."""

import random

from online_rl.offpeak import OffPeakConfig, OffPeakScheduler


def snap(load, states=("active", "active"), pending=()):
    reps = [
        {
            "id": f"r{i}",
            "state": s,
            "healthy": True,
            "outstanding": 0,
            "rollout_outstanding": 0,
            "borrow_pending": f"r{i}" in pending,
        }
        for i, s in enumerate(states)
    ]
    return {"fleet": {"load_per_active": load}, "replicas": reps}


def cfg(**kw):
    base = dict(
        gateway_url="http://unused",
        admin_token="t",
        low_water=0.5,
        high_water=2.0,
        hold_s=10,
        cooldown_s=5,
        max_share=0.5,
        smoothing_s=3,
    )
    return OffPeakConfig(**{**base, **kw})


def run(sched, loads, states, dt=1.0, t0=1000.0):
    """Feed loads one per dt seconds, applying decisions to `states`; returns the decisions."""
    out = []
    for i, load in enumerate(loads):
        d = sched.decide(snap(load, tuple(states)), t0 + i * dt)
        if d is not None:
            out.append((i, d.action, d.replica))
            states[int(d.replica[1:])] = "borrowed" if d.action == "borrow" else "active"
            sched.last_action = t0 + i * dt
    return out


def test_borrows_after_the_hold_and_returns_at_the_rise():
    s = OffPeakScheduler(cfg())
    states = ["active", "active"]
    decisions = run(s, [3.0] * 5 + [0.1] * 30 + [3.0] * 5, states)
    assert [a for _, a, _ in decisions] == ["borrow", "return"]
    (t_borrow, _, _), (t_return, _, _) = decisions
    assert t_borrow >= 5 + 10  # low load for hold_s first (plus smoothing of the high stretch)
    assert t_return == 35  # at once when the load crosses the high-water mark


def test_never_the_last_active_and_never_more_than_the_share():
    s = OffPeakScheduler(cfg(max_share=1.0, cooldown_s=0))
    states = ["active", "active", "active"]
    run(s, [0.0] * 60, states)
    assert states.count("active") == 1  # two lent, the last one kept
    s = OffPeakScheduler(cfg(max_share=0.34))
    states = ["active", "active", "active"]
    run(s, [0.0] * 60, states)
    assert states.count("borrowed") == 1


def test_no_flapping_under_a_noisy_signal_between_the_marks():
    rng = random.Random(0)
    s = OffPeakScheduler(cfg())
    states = ["active", "active"]
    noisy_low = [max(0.0, 0.2 + rng.gauss(0, 0.15)) for _ in range(40)]
    noisy_mid = [min(1.9, max(0.6, 1.2 + rng.gauss(0, 0.4))) for _ in range(60)]
    decisions = run(s, noisy_low + noisy_mid, states)
    assert [a for _, a, _ in decisions] == ["borrow"]  # mid-range noise neither returns nor re-borrows


def test_busy_hours_make_it_more_careful():
    s = OffPeakScheduler(cfg(busy_hours=tuple(range(24))))  # every hour is busy: low-water halves
    assert run(s, [0.4] * 40, ["active", "active"]) == []
    s = OffPeakScheduler(cfg())
    assert [a for _, a, _ in run(s, [0.4] * 40, ["active", "active"])] == ["borrow"]
