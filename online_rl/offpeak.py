"""The off-peak scheduler: borrow serving replicas for rollouts while user load is low, give them back
before users notice.

It reads the fleet's user load from the gateway (`GET /admin/load`: requests in flight plus SGLang's
queue, per active replica) every `interval_s`, and acts through the gateway's admin API:
  borrow  when the smoothed load has stayed below `low_water` for `hold_s` (the gateway drains the replica
          first: in-flight user requests finish, then it takes rollouts only);
  return  as soon as the load crosses `high_water` (users come back at once; rollouts in flight there are
          aborted and redone by the trainer).
Between the two marks nothing happens (hysteresis), a borrow waits `cooldown_s` after any action, at most
`max_share` of the fleet is lent, never the last active replica, and `return_all()` (on stop) hands
everything back. No clock times are built in: an optional `busy_hours` hint only makes it more careful
then (the low-water mark is halved).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from admin_api.client import AdminClient
from admin_api.types import LoadAnswer
from infra.config import option

log = logging.getLogger(__name__)


@dataclass
class OffPeakConfig:
    gateway_url: str
    admin_token: str
    low_water: float = option(0.5, help="user requests (in flight + queued) per active replica to borrow under")
    high_water: float = option(2.0, help="user requests per active replica to return borrowed replicas over")
    hold_s: float = option(10.0, flag="hold", help="seconds of low load before borrowing")
    cooldown_s: float = 5.0
    max_share: float = 0.5
    interval_s: float = 1.0
    smoothing_s: float = 5.0  # time constant of the load average the borrow decision reads
    busy_hours: tuple = ()  # optional hint, local hours, e.g. (9, 10, 11, ...)


@dataclass
class Decision:
    action: str  # borrow | return
    replica: str
    load: float
    smoothed: float
    at: float = field(default_factory=time.monotonic)


class OffPeakScheduler:
    def __init__(self, cfg: OffPeakConfig):
        self.cfg = cfg
        self.admin = AdminClient(cfg.gateway_url, cfg.admin_token)  # the gateway's admin API
        self.smoothed: float | None = None
        self.low_since: float | None = None
        self.last_action = -math.inf
        self.last_tick: float | None = None
        self.decisions: list[Decision] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ gateway
    def load(self) -> LoadAnswer:
        return self.admin.load()

    # ------------------------------------------------------------------ policy
    def decide(self, snapshot: Mapping[str, Any], now: float) -> Decision | None:
        """The action (at most one) this load snapshot calls for; `now` is time.monotonic()."""
        fleet, reps = snapshot["fleet"], snapshot["replicas"]
        load = fleet["load_per_active"]
        dt = 0.0 if self.last_tick is None else max(0.0, now - self.last_tick)
        self.last_tick = now
        a = 1.0 - math.exp(-dt / self.cfg.smoothing_s) if self.smoothed is not None else 1.0
        self.smoothed = load if self.smoothed is None else self.smoothed + a * (load - self.smoothed)
        lent = [r for r in reps if r["state"] == "borrowed" or r["borrow_pending"]]
        if load > self.cfg.high_water and lent:
            self.low_since = None
            victim = min(lent, key=lambda r: r["rollout_outstanding"])  # the cheapest to hand back
            return Decision("return", victim["id"], load, self.smoothed, at=now)
        low_water = self.cfg.low_water * (0.5 if time.localtime().tm_hour in self.cfg.busy_hours else 1.0)
        # The smoothed load decides a borrow: one user's lone request in flight is not a rise, only noise.
        if self.smoothed >= low_water:
            self.low_since = None
            return None
        self.low_since = self.low_since if self.low_since is not None else now
        active = [r for r in reps if r["state"] == "active" and r["healthy"] and not r["borrow_pending"]]
        allowed = math.floor(self.cfg.max_share * len(reps))
        if (
            now - self.low_since >= self.cfg.hold_s
            and now - self.last_action >= self.cfg.cooldown_s
            and len(lent) < allowed
            and len(active) > 1
        ):
            pick = min(active, key=lambda r: (r["outstanding"], r["id"]))
            return Decision("borrow", pick["id"], load, self.smoothed, at=now)
        return None

    def act(self, d: Decision) -> bool:
        try:
            self.admin.replica_action(d.replica, d.action)
        except urllib.error.HTTPError as e:
            log.warning("gateway refused to %s %s: %s", d.action, d.replica, e.read()[:200])
            return False
        self.last_action = time.monotonic()
        self.decisions.append(d)
        if d.action == "borrow":
            self.low_since = None  # the next borrow needs a fresh stretch of low load
        log.info("%s %s (load %.2f per active replica, smoothed %.2f)", d.action, d.replica, d.load, d.smoothed)
        return True

    def tick(self) -> Decision | None:
        d = self.decide(self.load(), time.monotonic())
        if d is not None and self.act(d):
            return d
        return None

    def return_all(self) -> None:
        for r in self.load()["replicas"]:
            if r["state"] == "borrowed" or r["borrow_pending"]:
                self.act(Decision("return", r["id"], float("nan"), float("nan")))

    # ------------------------------------------------------------------ thread
    def start(self) -> "OffPeakScheduler":
        self._thread = threading.Thread(target=self._loop, name="offpeak", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.interval_s):
            try:
                self.tick()
            except Exception as e:  # the gateway may restart; keep following it
                log.warning("off-peak tick failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.return_all()
        except Exception as e:
            log.error("could not hand borrowed replicas back: %s", e)
